# Kiln on AWS: a VPC, an EKS cluster (CPU nodes for the control plane, GPU nodes for runtime
# workers), PostgreSQL 16 on RDS, an S3 bucket for the artifact store and the IAM role Kiln's
# service account assumes (IRSA). Kubernetes objects are in kubernetes/, applied with kubectl.

data "aws_caller_identity" "current" {}

locals {
  bucket = coalesce(var.artifact_bucket_name, "${var.name}-artifacts-${data.aws_caller_identity.current.account_id}")
}

module "kms_data" {
  source      = "./modules/kms"
  alias       = "${var.name}-data"
  description = "${var.name}: database, artifact bucket, Kubernetes secrets"
}

module "kms_logs" {
  source                = "./modules/kms"
  alias                 = "${var.name}-logs"
  description           = "${var.name}: CloudWatch log groups"
  allow_cloudwatch_logs = true
}

module "network" {
  source             = "./modules/network"
  name               = var.name
  region             = var.region
  cidr               = var.vpc_cidr
  azs                = var.availability_zones
  log_retention_days = var.log_retention_days
  logs_kms_key_arn   = module.kms_logs.arn
}

module "eks" {
  source                       = "./modules/eks"
  name                         = var.name
  kubernetes_version           = var.kubernetes_version
  subnet_ids                   = module.network.private_subnet_ids
  admin_principal_arns         = var.cluster_admin_arns
  secrets_kms_key_arn          = module.kms_data.arn
  logs_kms_key_arn             = module.kms_logs.arn
  log_retention_days           = var.log_retention_days
  control_plane_instance_types = var.control_plane_instance_types
  control_plane_min_size       = var.control_plane_min_size
  control_plane_max_size       = var.control_plane_max_size
  gpu_instance_types           = var.gpu_instance_types
  gpu_ami_type                 = var.gpu_ami_type
  gpu_min_size                 = var.gpu_min_size
  gpu_max_size                 = var.gpu_max_size
}

module "database" {
  source                   = "./modules/database"
  name                     = var.name
  vpc_id                   = module.network.vpc_id
  subnet_ids               = module.network.private_subnet_ids
  client_security_group_id = module.eks.cluster_security_group_id
  kms_key_arn              = module.kms_data.arn
  engine_version           = var.postgres_version
  instance_class           = var.db_instance_class
  db_name                  = var.db_name
  username                 = var.db_username
  allocated_storage        = var.db_allocated_storage
  max_allocated_storage    = var.db_max_allocated_storage
  multi_az                 = var.db_multi_az
  backup_retention_days    = var.db_backup_retention_days
}

module "artifacts" {
  source                  = "./modules/artifacts"
  bucket                  = local.bucket
  kms_key_arn             = module.kms_data.arn
  noncurrent_version_days = var.artifact_noncurrent_version_days
}

module "irsa" {
  source            = "./modules/irsa"
  name              = "${var.name}-service"
  oidc_provider_arn = module.eks.oidc_provider_arn
  oidc_issuer       = module.eks.oidc_issuer
  namespace         = var.kiln_namespace
  service_account   = var.kiln_service_account
  bucket_arn        = module.artifacts.arn
  kms_key_arn       = module.kms_data.arn
  # the gateway's KILN_DATABASE_URL user (kubernetes/gateway-config.yaml), with IAM tokens
  database_resource_id = module.database.resource_id
}

# Kiln's own logs (gateway and workers), shipped by a node log agent such as Fluent Bit.
resource "aws_cloudwatch_log_group" "kiln" {
  name              = "/kiln/${var.name}/application"
  retention_in_days = var.log_retention_days
  kms_key_id        = module.kms_logs.arn
}
