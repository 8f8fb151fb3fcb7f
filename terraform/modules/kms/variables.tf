variable "alias" {
  type        = string
  description = "Alias of the key, without the alias/ prefix."
}

variable "description" {
  type        = string
  description = "What the key encrypts."
}

variable "allow_cloudwatch_logs" {
  type        = bool
  description = "Let CloudWatch Logs encrypt this account's log groups in this region with the key."
  default     = false
}
