output "role_arn" {
  description = "ARN of the role (the service account's eks.amazonaws.com/role-arn annotation)."
  value       = aws_iam_role.this.arn
}
