provider "aws" {
  region = var.region

  default_tags {
    tags = merge(var.tags, {
      "kiln:deployment" = var.name
      "managed-by"      = "terraform"
    })
  }
}
