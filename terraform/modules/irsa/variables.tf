variable "name" {
  type        = string
  description = "Prefix of the role's name."
}

variable "oidc_provider_arn" {
  type        = string
  description = "ARN of the cluster's IAM OIDC provider."
}

variable "oidc_issuer" {
  type        = string
  description = "Issuer URL of the cluster's OIDC provider."
}

variable "namespace" {
  type        = string
  description = "Namespace of the service account."
}

variable "service_account" {
  type        = string
  description = "Name of the service account allowed to assume the role."
}

variable "bucket_arn" {
  type        = string
  description = "Artifact bucket the role may read and write."
}

variable "kms_key_arn" {
  type        = string
  description = "KMS key that encrypts the bucket."
}

variable "database_resource_id" {
  type        = string
  description = "DbiResourceId of the PostgreSQL instance the role may log in to with IAM tokens."
}

variable "database_user" {
  type        = string
  description = "The only database user the role's IAM tokens may log in as (Kiln's app role)."
  default     = "kiln_app"
}
