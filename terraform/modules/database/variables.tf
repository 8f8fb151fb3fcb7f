variable "name" {
  type        = string
  description = "Identifier of the instance and prefix of its resources."
}

variable "vpc_id" {
  type        = string
  description = "VPC of the database."
}

variable "subnet_ids" {
  type        = list(string)
  description = "Private subnets of the DB subnet group (two zones at least)."
}

variable "client_security_group_id" {
  type        = string
  description = "Security group whose members may connect (the EKS cluster's)."
}

variable "kms_key_arn" {
  type        = string
  description = "KMS key for storage, Performance Insights and the master password secret."
}

variable "engine_version" {
  type        = string
  description = "PostgreSQL version (16 or 16.x)."
}

variable "instance_class" {
  type        = string
  description = "RDS instance class."
}

variable "db_name" {
  type        = string
  description = "Database Kiln uses."
}

variable "username" {
  type        = string
  description = "Master user name (its password lives in Secrets Manager)."
}

variable "allocated_storage" {
  type        = number
  description = "Initial storage in GiB."
}

variable "max_allocated_storage" {
  type        = number
  description = "Storage autoscaling ceiling in GiB."
}

variable "multi_az" {
  type        = bool
  description = "Keep a synchronous standby in another zone."
}

variable "backup_retention_days" {
  type        = number
  description = "Days automated backups (point-in-time recovery) are kept."
}
