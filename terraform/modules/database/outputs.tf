output "endpoint" {
  description = "host:port of the instance."
  value       = aws_db_instance.this.endpoint
}

output "address" {
  description = "Host name of the instance."
  value       = aws_db_instance.this.address
}

output "secret_arn" {
  description = "Secrets Manager secret holding the master user's password (managed by RDS)."
  value       = aws_db_instance.this.master_user_secret[0].secret_arn
}

output "resource_id" {
  description = "DbiResourceId, for rds-db:connect IAM policies."
  value       = aws_db_instance.this.resource_id
}
