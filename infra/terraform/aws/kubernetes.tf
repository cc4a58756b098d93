# The rollout services on EKS: the platform secret in Secrets Manager, read by External
# Secrets through EKS Pod Identity; the operators the manifests need (cert-manager, External
# Secrets, KEDA); then infra/k8s/overlays/aws, applied through a generated cluster layer
# (cluster-kustomization.tftpl) that sets this deployment's image, bucket, region and secret.
# The apply runs on the machine that runs terraform: it needs aws, kubectl and helm there.

locals {
  k8s_dir = abspath("${path.module}/../../k8s")
  # One JSON object; its keys are the variable names the pods read (infra/k8s/base/secrets.yaml).
  platform_secret = merge(
    {
      ROLLOUT_NATS_PASSWORD = random_password.nats.result
      ROLLOUT_DATABASE_URL  = "postgresql://rollout:${random_password.postgres.result}@${aws_db_instance.postgres.address}:${aws_db_instance.postgres.port}/rollout?sslmode=require"
    },
    {
      for service in local.rollout_services :
      "ROLLOUT_NATS_PASSWORD_${upper(replace(service, "-", "_"))}" => random_password.nats_service[service].result
    },
  )
  cluster_kustomization = templatefile("${path.module}/cluster-kustomization.tftpl", {
    image_repository = var.image_repository
    image_tag        = var.image_tag
    object_store_url = "s3://${aws_s3_bucket.artifacts.bucket}/rollout"
    region           = var.region
    secret_name      = aws_secretsmanager_secret.platform.name
  })
  # Re-apply when a manifest or the cluster layer changes.
  k8s_digest = sha256(join("", concat(
    [for f in sort(fileset(local.k8s_dir, "**")) : filesha256("${local.k8s_dir}/${f}")],
    [local.cluster_kustomization],
  )))
}

# The VPC CNI's network policy agent enforces the manifests' NetworkPolicies (EKS installs the
# CNI itself; this takes it over with that setting on).
resource "aws_eks_addon" "vpc_cni" {
  cluster_name                = aws_eks_cluster.main.name
  addon_name                  = "vpc-cni"
  configuration_values        = jsonencode({ enableNetworkPolicy = "true" })
  resolve_conflicts_on_create = "OVERWRITE"
  resolve_conflicts_on_update = "OVERWRITE"
}

resource "aws_kms_key" "secrets" {
  description             = "${var.name}: the rollout platform secret"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "AccountAdministers"
      Effect    = "Allow"
      Principal = { AWS = "arn:aws:iam::${data.aws_caller_identity.current.account_id}:root" }
      Action    = "kms:*"
      Resource  = "*"
    }]
  })
}

resource "aws_secretsmanager_secret" "platform" {
  # checkov:skip=CKV2_AWS_57:the NATS passwords are baked into the servers' config as hashes; rotation is `terraform apply -replace` on random_password, which re-renders both sides
  name                    = "${var.name}-platform"
  description             = "rollout: NATS passwords (admin, one per service) and the database URL"
  kms_key_id              = aws_kms_key.secrets.arn
  recovery_window_in_days = 7
}

resource "aws_secretsmanager_secret_version" "platform" {
  secret_id     = aws_secretsmanager_secret.platform.id
  secret_string = jsonencode(local.platform_secret)
}

# External Secrets' controller reads only this secret (EKS Pod Identity: no keys anywhere).
resource "aws_iam_role" "external_secrets" {
  name = "${var.name}-external-secrets"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "pods.eks.amazonaws.com" }
      Action    = ["sts:AssumeRole", "sts:TagSession"]
    }]
  })
}

resource "aws_iam_role_policy" "external_secrets" {
  name = "platform-secret"
  role = aws_iam_role.external_secrets.id
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [
      {
        Effect   = "Allow"
        Action   = ["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"]
        Resource = aws_secretsmanager_secret.platform.arn
      },
      {
        Effect   = "Allow"
        Action   = ["kms:Decrypt"]
        Resource = aws_kms_key.secrets.arn
      },
    ]
  })
}

resource "aws_eks_pod_identity_association" "external_secrets" {
  cluster_name    = aws_eks_cluster.main.name
  namespace       = "external-secrets"
  service_account = "external-secrets"
  role_arn        = aws_iam_role.external_secrets.arn

  depends_on = [aws_eks_addon.pod_identity]
}

# cert-manager (NATS TLS), External Secrets (the pods' secrets) and KEDA (actor autoscaling).
resource "terraform_data" "operators" {
  triggers_replace = [var.cert_manager_version, var.external_secrets_version, var.keda_version]

  provisioner "local-exec" {
    interpreter = ["/bin/bash", "-c"]
    command     = <<-EOT
      set -euo pipefail
      export KUBECONFIG="$(mktemp)"; trap 'rm -f "$KUBECONFIG"' EXIT
      aws eks update-kubeconfig --name '${aws_eks_cluster.main.name}' --region '${var.region}'
      helm upgrade --install cert-manager cert-manager --repo https://charts.jetstack.io \
        --namespace cert-manager --create-namespace --version '${var.cert_manager_version}' \
        --set crds.enabled=true --wait
      helm upgrade --install external-secrets external-secrets --repo https://charts.external-secrets.io \
        --namespace external-secrets --create-namespace --version '${var.external_secrets_version}' --wait
      helm upgrade --install keda keda --repo https://kedacore.github.io/charts \
        --namespace keda --create-namespace --version '${var.keda_version}' --wait
    EOT
  }

  depends_on = [
    aws_eks_node_group.pool,
    aws_eks_addon.vpc_cni,
    aws_eks_pod_identity_association.external_secrets,
  ]
}

resource "terraform_data" "kubernetes" {
  triggers_replace = [local.k8s_digest]

  provisioner "local-exec" {
    interpreter = ["/bin/bash", "-c"]
    command     = <<-EOT
      set -euo pipefail
      work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
      cp -R '${local.k8s_dir}' "$work/k8s"
      mkdir "$work/k8s/cluster"
      printf '%s' "$CLUSTER_KUSTOMIZATION" > "$work/k8s/cluster/kustomization.yaml"
      export KUBECONFIG="$work/kubeconfig"
      aws eks update-kubeconfig --name '${aws_eks_cluster.main.name}' --region '${var.region}'
      kubectl apply --server-side -k "$work/k8s/cluster"
      kubectl -n '${var.kubernetes_namespace}' rollout status statefulset/nats --timeout=15m
    EOT
    environment = {
      CLUSTER_KUSTOMIZATION = local.cluster_kustomization
    }
  }

  depends_on = [
    terraform_data.operators,
    aws_secretsmanager_secret_version.platform,
    aws_eks_pod_identity_association.workload,
  ]
}
