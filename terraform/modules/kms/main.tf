# One customer-managed key with yearly rotation. The account root administers it, so IAM
# policies grant its use; with `allow_cloudwatch_logs` the CloudWatch Logs service may encrypt
# this account's log groups with it (it cannot use IAM grants).

data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

locals {
  account = data.aws_caller_identity.current.account_id
  arn     = "${data.aws_partition.current.partition}:logs:${data.aws_region.current.name}:${local.account}"
}

data "aws_iam_policy_document" "key" {
  #checkov:skip=CKV_AWS_109:key policy: Resource "*" is this key alone, and the account root must hold kms:* for IAM policies to grant it
  #checkov:skip=CKV_AWS_111:key policy: Resource "*" is this key alone; writes are limited to the account root and CloudWatch Logs
  #checkov:skip=CKV_AWS_356:key policy: Resource "*" is this key alone (a key policy cannot name other resources)
  statement {
    sid       = "AccountAdministers"
    actions   = ["kms:*"]
    resources = ["*"] # in a key policy, "*" is the key itself
    principals {
      type        = "AWS"
      identifiers = ["arn:${data.aws_partition.current.partition}:iam::${local.account}:root"]
    }
  }

  dynamic "statement" {
    for_each = var.allow_cloudwatch_logs ? [1] : []
    content {
      sid       = "CloudWatchLogsEncrypt"
      actions   = ["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"]
      resources = ["*"]
      principals {
        type        = "Service"
        identifiers = ["logs.${data.aws_region.current.name}.amazonaws.com"]
      }
      condition {
        test     = "ArnLike"
        variable = "kms:EncryptionContext:aws:logs:arn"
        values   = ["arn:${local.arn}:*"]
      }
    }
  }
}

resource "aws_kms_key" "this" {
  description             = var.description
  enable_key_rotation     = true
  rotation_period_in_days = 365
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.key.json
}

resource "aws_kms_alias" "this" {
  name          = "alias/${var.alias}"
  target_key_id = aws_kms_key.this.key_id
}
