variable "bucket" {
  type        = string
  description = "Name of the bucket (globally unique)."
}

variable "kms_key_arn" {
  type        = string
  description = "KMS key of the bucket's default encryption (SSE-KMS)."
}

variable "noncurrent_version_days" {
  type        = number
  description = "Days a deleted or overwritten object's old version is kept."
}
