output "cluster_name" {
  description = "Name of the EKS cluster (aws eks update-kubeconfig --name ...)."
  value       = module.eks.name
}

output "cluster_endpoint" {
  description = "Kubernetes API endpoint (private: reachable from inside the VPC)."
  value       = module.eks.endpoint
}

output "database_endpoint" {
  description = "host:port of the PostgreSQL instance."
  value       = module.database.endpoint
}

output "database_secret_arn" {
  description = "Secrets Manager secret with the master user's password (rotated by RDS)."
  value       = module.database.secret_arn
}

output "artifact_bucket_name" {
  description = "S3 bucket of the artifact store."
  value       = module.artifacts.name
}

output "kiln_irsa_role_arn" {
  description = "IAM role for Kiln's service account (eks.amazonaws.com/role-arn annotation)."
  value       = module.irsa.role_arn
}

output "log_group_name" {
  description = "CloudWatch log group for Kiln's application logs."
  value       = aws_cloudwatch_log_group.kiln.name
}

output "vpc_id" {
  description = "ID of the VPC."
  value       = module.network.vpc_id
}
