# The rollout services on GKE: the platform secret in Secret Manager, read by External Secrets
# through Workload Identity; the operators the manifests need (cert-manager, External Secrets,
# KEDA); then infra/k8s/overlays/gcp, applied through a generated cluster layer
# (cluster-kustomization.tftpl) that sets this deployment's image, bucket, project and secret.
# The apply runs on the machine that runs terraform: it needs gcloud, kubectl and helm there.

data "google_project" "current" {}

locals {
  k8s_dir = abspath("${path.module}/../../k8s")
  # One JSON object; its keys are the variable names the pods read (infra/k8s/base/secrets.yaml).
  platform_secret = merge(
    {
      ROLLOUT_NATS_PASSWORD = random_password.nats.result
      ROLLOUT_DATABASE_URL  = "postgresql://rollout:${random_password.postgres.result}@${google_sql_database_instance.postgres.private_ip_address}:5432/rollout?sslmode=require"
    },
    {
      for service in local.rollout_services :
      "ROLLOUT_NATS_PASSWORD_${upper(replace(service, "-", "_"))}" => random_password.nats_service[service].result
    },
  )
  cluster_kustomization = templatefile("${path.module}/cluster-kustomization.tftpl", {
    image_repository         = var.image_repository
    image_tag                = var.image_tag
    object_store_url         = "gs://${google_storage_bucket.artifacts.name}/rollout"
    project_id               = var.project_id
    secret_name              = google_secret_manager_secret.platform.secret_id
    workload_service_account = google_service_account.workload.email
  })
  # Re-apply when a manifest or the cluster layer changes.
  k8s_digest = sha256(join("", concat(
    [for f in sort(fileset(local.k8s_dir, "**")) : filesha256("${local.k8s_dir}/${f}")],
    [local.cluster_kustomization],
  )))
  # External Secrets' controller, as a Workload Identity principal (no Google service account).
  external_secrets_principal = "principal://iam.googleapis.com/projects/${data.google_project.current.number}/locations/global/workloadIdentityPools/${var.project_id}.svc.id.goog/subject/ns/external-secrets/sa/external-secrets"
}

resource "google_secret_manager_secret" "platform" {
  secret_id = "${var.name}-platform"

  replication {
    auto {}
  }

  depends_on = [google_project_service.apis]
}

resource "google_secret_manager_secret_version" "platform" {
  secret      = google_secret_manager_secret.platform.id
  secret_data = jsonencode(local.platform_secret)
}

resource "google_secret_manager_secret_iam_member" "external_secrets" {
  secret_id = google_secret_manager_secret.platform.id
  role      = "roles/secretmanager.secretAccessor"
  member    = local.external_secrets_principal
}

# cert-manager (NATS TLS), External Secrets (the pods' secrets) and KEDA (actor autoscaling).
resource "terraform_data" "operators" {
  triggers_replace = [var.cert_manager_version, var.external_secrets_version, var.keda_version]

  provisioner "local-exec" {
    interpreter = ["/bin/bash", "-c"]
    command     = <<-EOT
      set -euo pipefail
      export KUBECONFIG="$(mktemp)"; trap 'rm -f "$KUBECONFIG"' EXIT
      gcloud container clusters get-credentials '${google_container_cluster.main.name}' \
        --region '${var.region}' --project '${var.project_id}'
      helm upgrade --install cert-manager cert-manager --repo https://charts.jetstack.io \
        --namespace cert-manager --create-namespace --version '${var.cert_manager_version}' \
        --set crds.enabled=true --wait
      helm upgrade --install external-secrets external-secrets --repo https://charts.external-secrets.io \
        --namespace external-secrets --create-namespace --version '${var.external_secrets_version}' --wait
      helm upgrade --install keda keda --repo https://kedacore.github.io/charts \
        --namespace keda --create-namespace --version '${var.keda_version}' --wait
    EOT
  }

  depends_on = [google_container_node_pool.pool]
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
      gcloud container clusters get-credentials '${google_container_cluster.main.name}' \
        --region '${var.region}' --project '${var.project_id}'
      kubectl apply --server-side -k "$work/k8s/cluster"
      kubectl -n '${var.kubernetes_namespace}' rollout status statefulset/nats --timeout=15m
    EOT
    environment = {
      CLUSTER_KUSTOMIZATION = local.cluster_kustomization
    }
  }

  depends_on = [
    terraform_data.operators,
    google_secret_manager_secret_version.platform,
    google_secret_manager_secret_iam_member.external_secrets,
    google_service_account_iam_member.workload_identity,
  ]
}
