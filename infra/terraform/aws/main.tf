# rollout on AWS: a VPC, a 3-node NATS JetStream cluster on EC2, RDS PostgreSQL, an S3 bucket
# for checkpoints and trajectory batches, and an EKS cluster whose node groups run the services
# (CPU) and the actors and learner (GPU). outputs.tf gives the ROLLOUT_* values to set.

data "aws_availability_zones" "available" {
  # checkov:skip=CKV_AWS_394: the first three available zones of the region, by name; a zone added later sorts after them, so the choice does not change
  state = "available"
}

data "aws_caller_identity" "current" {}

locals {
  azs = slice(data.aws_availability_zones.available.names, 0, 3)

  # Private /19s hold the pods (the VPC CNI gives each pod a VPC address); public /22s hold
  # the NAT gateway and load balancers.
  private_subnets = [for i in range(3) : cidrsubnet(var.vpc_cidr, 3, i)]
  public_subnets  = [for i in range(3) : cidrsubnet(var.vpc_cidr, 6, 48 + i)]

  # Fixed addresses let every node's config list its cluster routes before any node exists.
  nats_ips      = [for i in range(3) : cidrhost(local.private_subnets[i], 10)]
  internal_zone = "${var.name}.internal"
  nats_host     = "nats.${local.internal_zone}"
  nats_routes = join(", ", [
    for ip in local.nats_ips : "nats-route://route:${random_password.nats_route.result}@${ip}:6222"
  ])
  rollout_services = ["env-registry", "tracker", "actor", "verifier", "learner", "buffer"]
  nats_authorization = templatefile("${path.module}/../nats-authorization.tftpl", merge(
    { admin_user = var.nats_user, admin_password_hash = random_password.nats.bcrypt_hash },
    {
      for service in local.rollout_services :
      "password_hash_${replace(service, "-", "_")}" => random_password.nats_service[service].bcrypt_hash
    },
  ))

  bucket_name = var.bucket_name != "" ? var.bucket_name : "${var.name}-artifacts-${data.aws_caller_identity.current.account_id}"

  node_groups = {
    system = {
      instance_types = var.system_instance_types
      sizes          = var.system_nodes
      ami_type       = "AL2023_x86_64_STANDARD"
      capacity_type  = "ON_DEMAND"
      gpu            = false
      disk_gb        = 50
    }
    actors = {
      instance_types = var.actor_instance_types
      sizes          = var.actor_nodes
      ami_type       = "AL2023_x86_64_NVIDIA"
      capacity_type  = var.gpu_capacity_type
      gpu            = true
      disk_gb        = 200
    }
    learner = {
      instance_types = var.learner_instance_types
      sizes          = var.learner_nodes
      ami_type       = "AL2023_x86_64_NVIDIA"
      capacity_type  = "ON_DEMAND"
      gpu            = true
      disk_gb        = 300
    }
  }
}

# ---------------------------------------------------------------------------------------------
# Network

resource "aws_vpc" "main" {
  # checkov:skip=CKV2_AWS_11: flow logs cost per GB and the platform needs none; enable them per deployment for network forensics
  cidr_block           = var.vpc_cidr
  enable_dns_support   = true
  enable_dns_hostnames = true

  tags = { Name = var.name }
}

# The VPC's default security group admits and sends nothing: every resource names its own.
resource "aws_default_security_group" "main" {
  vpc_id = aws_vpc.main.id
}

resource "aws_internet_gateway" "main" {
  vpc_id = aws_vpc.main.id
  tags   = { Name = var.name }
}

resource "aws_subnet" "public" {
  count             = 3
  vpc_id            = aws_vpc.main.id
  availability_zone = local.azs[count.index]
  cidr_block        = local.public_subnets[count.index]
  # Only the NAT gateway (an Elastic IP) and load balancers live here: nothing needs an
  # address assigned at launch.
  map_public_ip_on_launch = false

  tags = { Name = "${var.name}-public-${count.index}", "kubernetes.io/role/elb" = "1" }
}

resource "aws_subnet" "private" {
  count             = 3
  vpc_id            = aws_vpc.main.id
  availability_zone = local.azs[count.index]
  cidr_block        = local.private_subnets[count.index]

  tags = { Name = "${var.name}-private-${count.index}", "kubernetes.io/role/internal-elb" = "1" }
}

resource "aws_eip" "nat" {
  domain = "vpc"
  tags   = { Name = "${var.name}-nat" }
}

# One NAT gateway keeps the bill down; private subnets only need it for image pulls and
# downloads, not for traffic between the services.
resource "aws_nat_gateway" "main" {
  allocation_id = aws_eip.nat.id
  subnet_id     = aws_subnet.public[0].id
  tags          = { Name = var.name }

  depends_on = [aws_internet_gateway.main]
}

resource "aws_route_table" "public" {
  vpc_id = aws_vpc.main.id

  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.main.id
  }

  tags = { Name = "${var.name}-public" }
}

resource "aws_route_table" "private" {
  vpc_id = aws_vpc.main.id

  route {
    cidr_block     = "0.0.0.0/0"
    nat_gateway_id = aws_nat_gateway.main.id
  }

  tags = { Name = "${var.name}-private" }
}

resource "aws_route_table_association" "public" {
  count          = 3
  subnet_id      = aws_subnet.public[count.index].id
  route_table_id = aws_route_table.public.id
}

resource "aws_route_table_association" "private" {
  count          = 3
  subnet_id      = aws_subnet.private[count.index].id
  route_table_id = aws_route_table.private.id
}

# One name for the three NATS nodes: clients seed from it, then learn the cluster by gossip.
resource "aws_route53_zone" "internal" {
  name = local.internal_zone

  vpc {
    vpc_id = aws_vpc.main.id
  }
}

resource "aws_route53_record" "nats" {
  # checkov:skip=CKV2_AWS_23: the record points at the NATS instances' fixed private addresses (local.nats_ips), which checkov cannot follow
  zone_id = aws_route53_zone.internal.zone_id
  name    = local.nats_host
  type    = "A"
  ttl     = 60
  records = local.nats_ips
}

# ---------------------------------------------------------------------------------------------
# NATS: three EC2 nodes, JetStream on an EBS volume each, clustered over fixed private IPs.

resource "random_password" "nats" {
  length  = 32
  special = false
}

resource "random_password" "nats_route" {
  length  = 32
  special = false
}

# One NATS user per service, `svc_<service>`, with only its role's permissions: the users and
# permissions come from `rollout admin nats-config --terraform-template` (../nats-authorization.tftpl,
# regenerated from shared/auth/services.py, checked by tests/infra); the nodes get bcrypt hashes only.
resource "random_password" "nats_service" {
  for_each = toset(local.rollout_services)
  length   = 32
  special  = false
}

data "aws_ssm_parameter" "al2023" {
  name = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
}

resource "aws_security_group" "nats" {
  name        = "${var.name}-nats"
  description = "NATS clients from the VPC, cluster routes between the NATS nodes"
  vpc_id      = aws_vpc.main.id

  ingress {
    description = "clients"
    from_port   = 4222
    to_port     = 4222
    protocol    = "tcp"
    cidr_blocks = [var.vpc_cidr]
  }

  ingress {
    description = "monitoring (healthz, varz, jsz)"
    from_port   = 8222
    to_port     = 8222
    protocol    = "tcp"
    cidr_blocks = [var.vpc_cidr]
  }

  ingress {
    description = "cluster routes"
    from_port   = 6222
    to_port     = 6222
    protocol    = "tcp"
    self        = true
  }

  # HTTPS out (the nats-server release, SSM); anything within the VPC (DNS, routes, clients).
  egress {
    description = "HTTPS: the nats-server download and Session Manager"
    from_port   = 443
    to_port     = 443
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }

  egress {
    description = "within the VPC: DNS, cluster routes, replies to clients"
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    cidr_blocks = [var.vpc_cidr]
  }
}

# Operators reach the nodes with SSM Session Manager: no SSH keys, no open port 22.
resource "aws_iam_role" "nats" {
  name = "${var.name}-nats"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "ec2.amazonaws.com" }
      Action    = "sts:AssumeRole"
    }]
  })
}

resource "aws_iam_role_policy_attachment" "nats_ssm" {
  role       = aws_iam_role.nats.name
  policy_arn = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
}

resource "aws_iam_instance_profile" "nats" {
  name = "${var.name}-nats"
  role = aws_iam_role.nats.name
}

resource "aws_ebs_volume" "nats" {
  # checkov:skip=CKV_AWS_189: encrypted with the account's EBS key; a customer key would add key-policy upkeep and protect nothing more here (access is by IAM)
  count             = 3
  availability_zone = local.azs[count.index]
  size              = var.nats_volume_gb
  type              = "gp3"
  encrypted         = true

  tags = { Name = "${var.name}-nats-${count.index}" }
}

resource "aws_instance" "nats" {
  count                  = 3
  ami                    = data.aws_ssm_parameter.al2023.insecure_value
  instance_type          = var.nats_instance_type
  subnet_id              = aws_subnet.private[count.index].id
  private_ip             = local.nats_ips[count.index]
  vpc_security_group_ids = [aws_security_group.nats.id]
  iam_instance_profile   = aws_iam_instance_profile.nats.name

  ebs_optimized = true
  monitoring    = true

  metadata_options {
    http_tokens = "required"
  }

  root_block_device {
    volume_size = 20
    volume_type = "gp3"
    encrypted   = true
  }

  # The JetStream volume is attached after boot, so the script waits for it (by the NVMe
  # serial, which is the volume id) before formatting it once and mounting it. Gzipped: the
  # per-service permissions take the script past EC2's 16 KB of plain user data.
  user_data_base64 = base64gzip(<<-EOT
    #!/bin/bash
    set -euo pipefail
    dev=/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_${replace(aws_ebs_volume.nats[count.index].id, "-", "")}
    for attempt in $(seq 1 120); do [ -e "$dev" ] && break; sleep 5; done
    [ -e "$dev" ] || { echo "JetStream volume $dev never appeared" >&2; exit 1; }
    blkid "$dev" || mkfs.xfs "$dev"
    mkdir -p /var/lib/nats
    grep -q ' /var/lib/nats ' /etc/fstab || echo "$dev /var/lib/nats xfs defaults,nofail 0 2" >> /etc/fstab
    mount -a
    id nats || useradd --system --home-dir /var/lib/nats --shell /sbin/nologin nats
    chown nats:nats /var/lib/nats

    curl -fsSL -o /tmp/nats.tar.gz \
      https://github.com/nats-io/nats-server/releases/download/v${var.nats_version}/nats-server-v${var.nats_version}-linux-amd64.tar.gz
    tar -xzf /tmp/nats.tar.gz -C /tmp
    install -m 0755 /tmp/nats-server-v${var.nats_version}-linux-amd64/nats-server /usr/local/bin/nats-server

    install -d -m 0750 -o root -g nats /etc/nats
    cat > /etc/nats/nats.conf <<'CONF'
    server_name: ${var.name}-nats-${count.index}
    listen: 0.0.0.0:4222
    http: 0.0.0.0:8222
    jetstream {
      store_dir: /var/lib/nats
      max_file_store: ${floor(var.nats_volume_gb * 0.9)}G
    }
    cluster {
      name: ${var.name}
      listen: 0.0.0.0:6222
      authorization {
        user: route
        password: "${random_password.nats_route.result}"
      }
      routes: [${local.nats_routes}]
    }
    ${local.nats_authorization}
    CONF
    chown root:nats /etc/nats/nats.conf
    chmod 0640 /etc/nats/nats.conf

    cat > /etc/systemd/system/nats.service <<'UNIT'
    [Unit]
    Description=NATS server (rollout)
    After=network-online.target var-lib-nats.mount
    Wants=network-online.target
    [Service]
    User=nats
    ExecStart=/usr/local/bin/nats-server -c /etc/nats/nats.conf
    ExecReload=/bin/kill -HUP $MAINPID
    KillSignal=SIGUSR2
    Restart=always
    LimitNOFILE=800000
    [Install]
    WantedBy=multi-user.target
    UNIT
    systemctl daemon-reload
    systemctl enable --now nats
  EOT
  )

  tags = { Name = "${var.name}-nats-${count.index}" }

  # A new AMI must not replace all three nodes at once (JetStream would lose its quorum);
  # roll them one at a time with `terraform apply -replace='aws_instance.nats[N]'`.
  lifecycle {
    ignore_changes = [ami, user_data_base64]
  }
}

resource "aws_volume_attachment" "nats" {
  count       = 3
  device_name = "/dev/sdf"
  volume_id   = aws_ebs_volume.nats[count.index].id
  instance_id = aws_instance.nats[count.index].id
}

# ---------------------------------------------------------------------------------------------
# PostgreSQL (read models; rebuildable from the event log, so backups are a convenience).

resource "random_password" "postgres" {
  length  = 32
  special = false
}

resource "aws_db_subnet_group" "postgres" {
  name       = "${var.name}-postgres"
  subnet_ids = aws_subnet.private[*].id
}

resource "aws_security_group" "postgres" {
  name        = "${var.name}-postgres"
  description = "PostgreSQL from the VPC"
  vpc_id      = aws_vpc.main.id

  ingress {
    description = "PostgreSQL from the VPC (the tracker and buffer pods)"
    from_port   = 5432
    to_port     = 5432
    protocol    = "tcp"
    cidr_blocks = [var.vpc_cidr]
  }
}

resource "aws_db_instance" "postgres" {
  # checkov:skip=CKV2_AWS_30: logging every statement of the projections would flood the logs; the server and upgrade logs are exported
  # checkov:skip=CKV_AWS_118: enhanced monitoring needs its own IAM role and costs per instance; CloudWatch's standard metrics and the exported logs cover the read models
  # checkov:skip=CKV_AWS_157: multi_az is var.postgres_multi_az: the read models are rebuildable from the event log, so a standby is the operator's cost choice
  # checkov:skip=CKV_AWS_353: Performance Insights is a paid diagnostic for the operator to enable; the read models are rebuildable from the log
  identifier                 = "${var.name}-postgres"
  engine                     = "postgres"
  engine_version             = var.postgres_version
  instance_class             = var.postgres_instance_class
  allocated_storage          = var.postgres_storage_gb
  max_allocated_storage      = var.postgres_storage_gb * 4
  storage_type               = "gp3"
  storage_encrypted          = true
  db_name                    = "rollout"
  username                   = "rollout"
  password                   = random_password.postgres.result
  db_subnet_group_name       = aws_db_subnet_group.postgres.name
  vpc_security_group_ids     = [aws_security_group.postgres.id]
  publicly_accessible        = false
  multi_az                   = var.postgres_multi_az
  backup_retention_period    = 7
  auto_minor_version_upgrade = true
  copy_tags_to_snapshot      = true
  # IAM tokens may be used besides the password; the server's logs go to CloudWatch.
  iam_database_authentication_enabled = true
  enabled_cloudwatch_logs_exports     = ["postgresql", "upgrade"]
  deletion_protection                 = var.deletion_protection
  skip_final_snapshot                 = !var.deletion_protection
  final_snapshot_identifier           = "${var.name}-postgres-final"
}

# ---------------------------------------------------------------------------------------------
# S3: checkpoints and large trajectory batches (claim check: events carry URI + sha256).

resource "aws_s3_bucket" "artifacts" {
  # checkov:skip=CKV2_AWS_62: nothing consumes bucket events: the platform's events are on NATS, and events carry the URI and sha256 of what they store
  # checkov:skip=CKV_AWS_144: checkpoints and batches are re-creatable from the event log; replication to a second region is a disaster-recovery choice for the operator
  # checkov:skip=CKV_AWS_145: SSE-S3 (AES256): a customer key would need kms grants for every pod; access is by the workload role alone
  # checkov:skip=CKV_AWS_18: access logging needs a second bucket per deployment; CloudTrail data events are the operator's choice for auditing object access
  bucket        = local.bucket_name
  force_destroy = var.bucket_force_destroy
}

resource "aws_s3_bucket_public_access_block" "artifacts" {
  bucket                  = aws_s3_bucket.artifacts.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_server_side_encryption_configuration" "artifacts" {
  bucket = aws_s3_bucket.artifacts.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

# Versioning guards checkpoints against an accidental delete; old versions expire.
resource "aws_s3_bucket_versioning" "artifacts" {
  bucket = aws_s3_bucket.artifacts.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "artifacts" {
  bucket = aws_s3_bucket.artifacts.id

  rule {
    id     = "tidy"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }

    noncurrent_version_expiration {
      noncurrent_days = 30
    }
  }

  depends_on = [aws_s3_bucket_versioning.artifacts]
}

# ---------------------------------------------------------------------------------------------
# EKS: the services run here. CPU node group for tracker, env-registry, verifier and buffer;
# GPU node groups (tainted nvidia.com/gpu) for the actors and the learner.

resource "aws_iam_role" "cluster" {
  name = "${var.name}-eks-cluster"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "eks.amazonaws.com" }
      Action    = ["sts:AssumeRole", "sts:TagSession"]
    }]
  })
}

resource "aws_iam_role_policy_attachment" "cluster" {
  role       = aws_iam_role.cluster.name
  policy_arn = "arn:aws:iam::aws:policy/AmazonEKSClusterPolicy"
}

resource "aws_eks_cluster" "main" {
  # checkov:skip=CKV_AWS_38: the public endpoint exists only when var.eks_public_access_cidrs names networks (then only those); the default is private only
  # checkov:skip=CKV_AWS_58: EKS envelope-encrypts all Kubernetes API data by default (KMS v2) since 1.28, and the platform's secrets live in Secrets Manager under their own KMS key
  name     = var.name
  version  = var.kubernetes_version
  role_arn = aws_iam_role.cluster.arn

  vpc_config {
    subnet_ids              = aws_subnet.private[*].id
    endpoint_private_access = true
    endpoint_public_access  = length(var.eks_public_access_cidrs) > 0
    public_access_cidrs     = length(var.eks_public_access_cidrs) > 0 ? var.eks_public_access_cidrs : null
  }

  enabled_cluster_log_types = ["api", "audit", "authenticator", "controllerManager", "scheduler"]

  access_config {
    authentication_mode                         = "API"
    bootstrap_cluster_creator_admin_permissions = true
  }

  depends_on = [aws_iam_role_policy_attachment.cluster]
}

resource "aws_iam_role" "node" {
  name = "${var.name}-eks-node"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "ec2.amazonaws.com" }
      Action    = "sts:AssumeRole"
    }]
  })
}

resource "aws_iam_role_policy_attachment" "node" {
  for_each = toset([
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
  ])
  role       = aws_iam_role.node.name
  policy_arn = each.value
}

resource "aws_eks_node_group" "pool" {
  for_each = local.node_groups

  cluster_name    = aws_eks_cluster.main.name
  node_group_name = each.key
  node_role_arn   = aws_iam_role.node.arn
  subnet_ids      = aws_subnet.private[*].id
  instance_types  = each.value.instance_types
  ami_type        = each.value.ami_type
  capacity_type   = each.value.capacity_type
  disk_size       = each.value.disk_gb

  scaling_config {
    min_size     = each.value.sizes.min
    desired_size = each.value.sizes.desired
    max_size     = each.value.sizes.max
  }

  labels = { "rollout.dev/pool" = each.key }

  # Only pods that ask for a GPU (and tolerate this taint) land on the GPU nodes.
  dynamic "taint" {
    for_each = each.value.gpu ? [each.key] : []
    content {
      key    = "nvidia.com/gpu"
      value  = "true"
      effect = "NO_SCHEDULE"
    }
  }

  # The cluster autoscaler owns the desired size once the group exists.
  lifecycle {
    ignore_changes = [scaling_config[0].desired_size]
  }

  depends_on = [aws_iam_role_policy_attachment.node]
}

# Bucket access for the rollout pods through EKS Pod Identity (no keys in the pods, and the
# nodes themselves get none).
resource "aws_eks_addon" "pod_identity" {
  cluster_name = aws_eks_cluster.main.name
  addon_name   = "eks-pod-identity-agent"
}

resource "aws_iam_role" "workload" {
  name = "${var.name}-workload"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "pods.eks.amazonaws.com" }
      Action    = ["sts:AssumeRole", "sts:TagSession"]
    }]
  })
}

resource "aws_iam_role_policy" "workload_bucket" {
  name = "artifacts-bucket"
  role = aws_iam_role.workload.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Effect   = "Allow"
        Action   = ["s3:ListBucket"]
        Resource = aws_s3_bucket.artifacts.arn
      },
      {
        Effect   = "Allow"
        Action   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
        Resource = "${aws_s3_bucket.artifacts.arn}/*"
      },
    ]
  })
}

resource "aws_eks_pod_identity_association" "workload" {
  cluster_name    = aws_eks_cluster.main.name
  namespace       = var.kubernetes_namespace
  service_account = var.kubernetes_service_account
  role_arn        = aws_iam_role.workload.arn

  depends_on = [aws_eks_addon.pod_identity]
}
