# Two managed node groups: CPU nodes for the control plane (gateway, KEDA, Prometheus) and GPU
# nodes for runtime workers. GPU nodes carry a taint only pool workers tolerate, and the group's
# minimum is 0 so that, with every pool at zero, no GPU instance runs.

locals {
  groups = {
    control_plane = {
      instance_types = var.control_plane_instance_types
      ami_type       = "AL2023_x86_64_STANDARD"
      min            = var.control_plane_min_size
      max            = var.control_plane_max_size
      disk_gb        = 50
      labels         = { "kiln.dev/node-class" = "cpu" }
      taints         = []
    }
    gpu = {
      instance_types = var.gpu_instance_types
      ami_type       = var.gpu_ami_type
      min            = var.gpu_min_size
      max            = var.gpu_max_size
      disk_gb        = 200 # engine images and compiled TensorRT engines are large
      labels         = { "kiln.dev/node-class" = "gpu", "nvidia.com/gpu.present" = "true" }
      taints         = [{ key = "nvidia.com/gpu", value = "true", effect = "NO_SCHEDULE" }]
    }
  }
}

# IMDSv2 only, one hop: pods cannot borrow the node's role (they get theirs through IRSA).
resource "aws_launch_template" "node" {
  for_each    = local.groups
  name_prefix = "${var.name}-${replace(each.key, "_", "-")}-"

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  block_device_mappings {
    device_name = "/dev/xvda"
    ebs {
      volume_size           = each.value.disk_gb
      volume_type           = "gp3"
      encrypted             = true # the account's aws/ebs key: a customer key would need a
      delete_on_termination = true # grant for the Auto Scaling service-linked role first
    }
  }
}

resource "aws_eks_node_group" "this" {
  for_each        = local.groups
  cluster_name    = aws_eks_cluster.this.name
  node_group_name = replace(each.key, "_", "-")
  node_role_arn   = aws_iam_role.node.arn
  subnet_ids      = var.subnet_ids
  instance_types  = each.value.instance_types
  ami_type        = each.value.ami_type
  labels          = each.value.labels

  dynamic "taint" {
    for_each = each.value.taints
    content {
      key    = taint.value.key
      value  = taint.value.value
      effect = taint.value.effect
    }
  }

  launch_template {
    id      = aws_launch_template.node[each.key].id
    version = aws_launch_template.node[each.key].latest_version
  }

  scaling_config {
    min_size     = each.value.min
    max_size     = each.value.max
    desired_size = each.value.min
  }

  update_config {
    max_unavailable = 1
  }

  lifecycle {
    ignore_changes = [scaling_config[0].desired_size] # the cluster autoscaler owns it
  }

  depends_on = [aws_iam_role_policy_attachment.node]
}
