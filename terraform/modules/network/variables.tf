variable "name" {
  type        = string
  description = "Prefix of every resource name."
}

variable "region" {
  type        = string
  description = "AWS region (for the S3 gateway endpoint's service name)."
}

variable "cidr" {
  type        = string
  description = "IPv4 CIDR of the VPC (a /16 leaves a /20 per private subnet)."
}

variable "azs" {
  type        = list(string)
  description = "Availability zones, one private and one public subnet each."
}

variable "log_retention_days" {
  type        = number
  description = "Days the flow logs are kept."
}

variable "logs_kms_key_arn" {
  type        = string
  description = "KMS key that encrypts the flow log group."
}
