variable "name" {
  type        = string
  description = "Name of the deployment: prefix of every resource, name of the EKS cluster."
  default     = "kiln"
  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,22}[a-z0-9]$", var.name))
    error_message = "name: 3-24 characters, lower-case letters, digits and hyphens, starting with a letter."
  }
}

variable "region" {
  type        = string
  description = "AWS region."
  default     = "eu-west-1"
  validation {
    condition     = can(regex("^[a-z]{2}(-gov)?-[a-z]+-[0-9]$", var.region))
    error_message = "region: an AWS region name such as eu-west-1."
  }
}

variable "tags" {
  type        = map(string)
  description = "Tags added to every resource."
  default     = {}
}

variable "vpc_cidr" {
  type        = string
  description = "IPv4 CIDR of the VPC; a /16 gives each private subnet a /20."
  default     = "10.40.0.0/16"
  validation {
    condition     = can(cidrnetmask(var.vpc_cidr)) && tonumber(split("/", var.vpc_cidr)[1]) <= 18
    error_message = "vpc_cidr: an IPv4 CIDR block of /18 or larger."
  }
}

variable "availability_zones" {
  type        = list(string)
  description = "Zones of the region the VPC, nodes and database standby span (named, so the set never changes by itself)."
  default     = ["eu-west-1a", "eu-west-1b", "eu-west-1c"]
  validation {
    condition     = length(var.availability_zones) >= 2 && alltrue([for az in var.availability_zones : startswith(az, var.region)])
    error_message = "availability_zones: two or more zones of var.region (EKS and RDS need two at least)."
  }
}

variable "kubernetes_version" {
  type        = string
  description = "Kubernetes minor version of the EKS control plane."
  default     = "1.34"
  validation {
    condition     = can(regex("^1\\.(29|3[0-9])$", var.kubernetes_version))
    error_message = "kubernetes_version: a minor version such as 1.34 (1.29 or newer)."
  }
}

variable "cluster_admin_arns" {
  type        = list(string)
  description = "IAM roles or users given cluster-admin (besides whoever runs terraform apply)."
  default     = []
  validation {
    condition     = alltrue([for arn in var.cluster_admin_arns : can(regex("^arn:aws[a-z-]*:iam::[0-9]{12}:(role|user)/", arn))])
    error_message = "cluster_admin_arns: IAM role or user ARNs."
  }
}

variable "control_plane_instance_types" {
  type        = list(string)
  description = "Instance types of the CPU node group (gateway, KEDA, Prometheus)."
  default     = ["m7i.large"]
  validation {
    condition     = length(var.control_plane_instance_types) > 0
    error_message = "control_plane_instance_types: at least one instance type."
  }
}

variable "control_plane_min_size" {
  type        = number
  description = "Fewest CPU nodes; two keep the gateway up through a node replacement."
  default     = 2
  validation {
    condition     = var.control_plane_min_size >= 1
    error_message = "control_plane_min_size: at least 1 (the control plane never scales to zero)."
  }
}

variable "control_plane_max_size" {
  type        = number
  description = "Most CPU nodes."
  default     = 4
  validation {
    condition     = var.control_plane_max_size >= var.control_plane_min_size
    error_message = "control_plane_max_size: at least control_plane_min_size."
  }
}

variable "gpu_instance_types" {
  type        = list(string)
  description = "Instance types of the GPU node group (one NVIDIA GPU each suits one worker a node)."
  default     = ["g5.xlarge", "g6.xlarge"]
  validation {
    condition     = length(var.gpu_instance_types) > 0
    error_message = "gpu_instance_types: at least one instance type."
  }
}

variable "gpu_ami_type" {
  type        = string
  description = "EKS AMI type of the GPU nodes (Amazon Linux 2023 with the NVIDIA driver; the launch template sizes /dev/xvda)."
  default     = "AL2023_x86_64_NVIDIA"
  validation {
    condition     = contains(["AL2023_x86_64_NVIDIA", "AL2023_ARM_64_NVIDIA"], var.gpu_ami_type)
    error_message = "gpu_ami_type: AL2023_x86_64_NVIDIA, or AL2023_ARM_64_NVIDIA for Graviton GPU instances (arm64 images)."
  }
}

variable "gpu_min_size" {
  type        = number
  description = "Fewest GPU nodes; 0 lets every GPU node go when all pools are at zero."
  default     = 0
  validation {
    condition     = var.gpu_min_size >= 0
    error_message = "gpu_min_size: 0 or more."
  }
}

variable "gpu_max_size" {
  type        = number
  description = "Most GPU nodes: the ceiling on GPU spend."
  default     = 4
  validation {
    condition     = var.gpu_max_size >= 1 && var.gpu_max_size >= var.gpu_min_size
    error_message = "gpu_max_size: at least 1 and at least gpu_min_size."
  }
}

variable "postgres_version" {
  type        = string
  description = "PostgreSQL engine version: 16 (RDS picks the default minor) or 16.x."
  default     = "16"
  validation {
    condition     = can(regex("^16(\\.[0-9]+)?$", var.postgres_version))
    error_message = "postgres_version: 16 or 16.x (Kiln's migrations are tested on PostgreSQL 16)."
  }
}

variable "db_instance_class" {
  type        = string
  description = "RDS instance class."
  default     = "db.m7g.large"
  validation {
    condition     = startswith(var.db_instance_class, "db.")
    error_message = "db_instance_class: an RDS instance class such as db.m7g.large."
  }
}

variable "db_name" {
  type        = string
  description = "Database Kiln uses."
  default     = "kiln"
  validation {
    condition     = can(regex("^[a-z][a-z0-9_]{0,62}$", var.db_name))
    error_message = "db_name: a PostgreSQL identifier (lower case, digits, underscores)."
  }
}

variable "db_username" {
  type        = string
  description = "Master user name; its password is generated into Secrets Manager."
  default     = "kiln_admin"
  validation {
    condition     = can(regex("^[a-z][a-z0-9_]{0,62}$", var.db_username)) && !contains(["admin", "postgres", "rdsadmin"], var.db_username)
    error_message = "db_username: a PostgreSQL identifier, not a name RDS reserves."
  }
}

variable "db_allocated_storage" {
  type        = number
  description = "Initial storage in GiB."
  default     = 50
  validation {
    condition     = var.db_allocated_storage >= 20
    error_message = "db_allocated_storage: 20 GiB or more (the gp3 minimum)."
  }
}

variable "db_max_allocated_storage" {
  type        = number
  description = "Ceiling of storage autoscaling in GiB."
  default     = 500
  validation {
    condition     = var.db_max_allocated_storage > var.db_allocated_storage
    error_message = "db_max_allocated_storage: more than db_allocated_storage, or storage cannot grow."
  }
}

variable "db_multi_az" {
  type        = bool
  description = "Keep a synchronous standby in a second zone (failover in about a minute)."
  default     = true
}

variable "db_backup_retention_days" {
  type        = number
  description = "Days of automated backups (point-in-time recovery window)."
  default     = 14
  validation {
    condition     = var.db_backup_retention_days >= 7 && var.db_backup_retention_days <= 35
    error_message = "db_backup_retention_days: 7 to 35."
  }
}

variable "artifact_bucket_name" {
  type        = string
  description = "Name of the artifact bucket; null gives <name>-artifacts-<account id>."
  default     = null
  validation {
    condition     = var.artifact_bucket_name == null || can(regex("^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", var.artifact_bucket_name))
    error_message = "artifact_bucket_name: a valid S3 bucket name."
  }
}

variable "artifact_noncurrent_version_days" {
  type        = number
  description = "Days an overwritten or deleted artifact's previous version is kept."
  default     = 30
  validation {
    condition     = var.artifact_noncurrent_version_days >= 1
    error_message = "artifact_noncurrent_version_days: 1 or more."
  }
}

variable "kiln_namespace" {
  type        = string
  description = "Kubernetes namespace of Kiln (kubernetes/namespace.yaml)."
  default     = "kiln"
}

variable "kiln_service_account" {
  type        = string
  description = "Service account of Kiln's pods (kubernetes/serviceaccount.yaml)."
  default     = "kiln"
}

variable "log_retention_days" {
  type        = number
  description = "Days every log group keeps its events (a year at least, for audit)."
  default     = 365
  validation {
    condition     = contains([365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "log_retention_days: a CloudWatch retention of a year or more (365, 400, 545, 731, 1096, ...)."
  }
}
