variable "name" {
  type        = string
  description = "Name of the cluster and prefix of its resources."
}

variable "kubernetes_version" {
  type        = string
  description = "Kubernetes minor version of the control plane."
}

variable "subnet_ids" {
  type        = list(string)
  description = "Private subnets of the control plane's network interfaces and of the nodes."
}

variable "admin_principal_arns" {
  type        = list(string)
  description = "IAM roles or users granted cluster-admin through EKS access entries."
}

variable "secrets_kms_key_arn" {
  type        = string
  description = "KMS key that encrypts Kubernetes secrets."
}

variable "logs_kms_key_arn" {
  type        = string
  description = "KMS key that encrypts the control-plane log group."
}

variable "log_retention_days" {
  type        = number
  description = "Days the control-plane logs are kept."
}

variable "control_plane_instance_types" {
  type        = list(string)
  description = "Instance types of the CPU node group."
}

variable "control_plane_min_size" {
  type        = number
  description = "Fewest CPU nodes."
}

variable "control_plane_max_size" {
  type        = number
  description = "Most CPU nodes."
}

variable "gpu_instance_types" {
  type        = list(string)
  description = "Instance types of the GPU node group."
}

variable "gpu_ami_type" {
  type        = string
  description = "EKS AMI type of the GPU nodes (one with the NVIDIA driver)."
}

variable "gpu_min_size" {
  type        = number
  description = "Fewest GPU nodes (0: none while every pool is at zero)."
}

variable "gpu_max_size" {
  type        = number
  description = "Most GPU nodes."
}
