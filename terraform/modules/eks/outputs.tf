output "name" {
  description = "Name of the cluster."
  value       = aws_eks_cluster.this.name
}

output "endpoint" {
  description = "Kubernetes API endpoint (private)."
  value       = aws_eks_cluster.this.endpoint
}

output "certificate_authority" {
  description = "Base64 CA certificate of the API endpoint."
  value       = aws_eks_cluster.this.certificate_authority[0].data
}

output "cluster_security_group_id" {
  description = "Security group EKS attaches to the control plane and the managed nodes."
  value       = aws_eks_cluster.this.vpc_config[0].cluster_security_group_id
}

output "oidc_provider_arn" {
  description = "ARN of the IAM OIDC provider (IRSA)."
  value       = aws_iam_openid_connect_provider.this.arn
}

output "oidc_issuer" {
  description = "OIDC issuer URL of the cluster."
  value       = aws_eks_cluster.this.identity[0].oidc[0].issuer
}
