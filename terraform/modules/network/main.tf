# A VPC over `azs` zones: a private subnet per zone for nodes and the database, a small public
# subnet per zone that holds only the NAT gateway (nothing there gets a public address).

locals {
  private = { for i, az in var.azs : az => cidrsubnet(var.cidr, 4, i) }
  public  = { for i, az in var.azs : az => cidrsubnet(var.cidr, 8, 240 + i) }
}

resource "aws_vpc" "this" {
  cidr_block           = var.cidr
  enable_dns_support   = true
  enable_dns_hostnames = true
  tags                 = { Name = var.name }
}

# Takes every rule away from the VPC's default security group: nothing may use it.
resource "aws_default_security_group" "this" {
  vpc_id = aws_vpc.this.id
}

resource "aws_subnet" "private" {
  for_each          = local.private
  vpc_id            = aws_vpc.this.id
  availability_zone = each.key
  cidr_block        = each.value
  tags = {
    Name                              = "${var.name}-private-${each.key}"
    "kubernetes.io/role/internal-elb" = "1"
  }
}

resource "aws_subnet" "public" {
  for_each          = local.public
  vpc_id            = aws_vpc.this.id
  availability_zone = each.key
  cidr_block        = each.value
  tags              = { Name = "${var.name}-public-${each.key}" }
}

resource "aws_internet_gateway" "this" {
  vpc_id = aws_vpc.this.id
  tags   = { Name = var.name }
}

# One NAT gateway (in the first zone) keeps the bill small; a zone outage then cuts egress.
resource "aws_eip" "nat" {
  domain = "vpc"
  tags   = { Name = "${var.name}-nat" }
}

resource "aws_nat_gateway" "this" {
  allocation_id = aws_eip.nat.id
  subnet_id     = aws_subnet.public[var.azs[0]].id
  tags          = { Name = var.name }
  depends_on    = [aws_internet_gateway.this]
}

# Public subnets route to the internet gateway, private ones through the NAT gateway.
locals {
  tiers = {
    public  = { subnets = aws_subnet.public, gateway = aws_internet_gateway.this.id, nat = null }
    private = { subnets = aws_subnet.private, gateway = null, nat = aws_nat_gateway.this.id }
  }
  associations = merge([
    for tier, t in local.tiers : {
      for az, subnet in t.subnets : "${tier}-${az}" => { tier = tier, subnet = subnet.id }
    }
  ]...)
}

resource "aws_route_table" "this" {
  for_each = local.tiers
  vpc_id   = aws_vpc.this.id
  route {
    cidr_block     = "0.0.0.0/0"
    gateway_id     = each.value.gateway
    nat_gateway_id = each.value.nat
  }
  tags = { Name = "${var.name}-${each.key}" }
}

resource "aws_route_table_association" "this" {
  for_each       = local.associations
  subnet_id      = each.value.subnet
  route_table_id = aws_route_table.this[each.value.tier].id
}

# S3 traffic (artifacts) stays on AWS's network and skips the NAT gateway's per-GB charge.
resource "aws_vpc_endpoint" "s3" {
  vpc_id            = aws_vpc.this.id
  service_name      = "com.amazonaws.${var.region}.s3"
  vpc_endpoint_type = "Gateway"
  route_table_ids   = [aws_route_table.this["private"].id]
  tags              = { Name = "${var.name}-s3" }
}
