# rollout on GCP: a VPC, a 3-node NATS JetStream cluster on Compute Engine, Cloud SQL for
# PostgreSQL, a GCS bucket for checkpoints and trajectory batches, and a GKE cluster whose node
# pools run the services (CPU) and the actors and learner (GPU). outputs.tf gives the
# ROLLOUT_* values to set.

data "google_compute_zones" "available" {
  region = var.region
}

locals {
  zones    = length(var.zones) == 3 ? var.zones : slice(data.google_compute_zones.available.names, 0, 3)
  gpu_zone = var.gpu_zone != "" ? var.gpu_zone : local.zones[0]

  # Fixed addresses let every node's config list its cluster routes before any node exists.
  nats_ips      = [for i in range(3) : cidrhost(var.subnet_cidr, 10 + i)]
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

  bucket_name = var.bucket_name != "" ? var.bucket_name : "${var.project_id}-${var.name}-artifacts"

  node_pools = {
    system = {
      machine_type = var.system_machine_type
      locations    = local.zones
      min          = var.system_nodes_per_zone.min
      max          = var.system_nodes_per_zone.max
      spot         = false
      gpu          = null
      disk_gb      = 50
    }
    actors = {
      machine_type = var.actor_machine_type
      locations    = [local.gpu_zone]
      min          = var.actor_nodes.min
      max          = var.actor_nodes.max
      spot         = var.actor_spot
      gpu          = var.actor_gpu
      disk_gb      = 200
    }
    learner = {
      machine_type = var.learner_machine_type
      locations    = [local.gpu_zone]
      min          = var.learner_nodes.min
      max          = var.learner_nodes.max
      spot         = false
      gpu          = var.learner_gpu
      disk_gb      = 300
    }
  }
}

resource "google_project_service" "apis" {
  for_each = toset([
    "compute.googleapis.com",
    "container.googleapis.com",
    "dns.googleapis.com",
    "servicenetworking.googleapis.com",
    "sqladmin.googleapis.com",
    "iam.googleapis.com",
    "secretmanager.googleapis.com",
  ])
  service            = each.value
  disable_on_destroy = false
}

# ---------------------------------------------------------------------------------------------
# Network

resource "google_compute_network" "main" {
  name                    = var.name
  auto_create_subnetworks = false

  depends_on = [google_project_service.apis]
}

resource "google_compute_subnetwork" "main" {
  # checkov:skip=CKV_GCP_26: flow logs cost per GB and the platform needs none; enable them per deployment for network forensics
  name                     = var.name
  network                  = google_compute_network.main.id
  region                   = var.region
  ip_cidr_range            = var.subnet_cidr
  private_ip_google_access = true

  secondary_ip_range {
    range_name    = "pods"
    ip_cidr_range = var.pods_cidr
  }

  secondary_ip_range {
    range_name    = "services"
    ip_cidr_range = var.services_cidr
  }
}

# Nothing here has a public address; Cloud NAT lets nodes pull images and NATS download itself.
resource "google_compute_router" "main" {
  name    = var.name
  network = google_compute_network.main.id
  region  = var.region
}

resource "google_compute_router_nat" "main" {
  name                               = var.name
  router                             = google_compute_router.main.name
  region                             = var.region
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "ALL_SUBNETWORKS_ALL_IP_RANGES"
}

resource "google_compute_firewall" "nats_clients" {
  name          = "${var.name}-nats-clients"
  network       = google_compute_network.main.id
  description   = "NATS clients and monitoring from nodes and pods"
  source_ranges = [var.subnet_cidr, var.pods_cidr]
  target_tags   = ["${var.name}-nats"]

  allow {
    protocol = "tcp"
    ports    = ["4222", "8222"]
  }
}

resource "google_compute_firewall" "nats_routes" {
  name        = "${var.name}-nats-routes"
  network     = google_compute_network.main.id
  description = "NATS cluster routes between the NATS nodes"
  source_tags = ["${var.name}-nats"]
  target_tags = ["${var.name}-nats"]

  allow {
    protocol = "tcp"
    ports    = ["6222"]
  }
}

# Operators reach the NATS nodes through IAP TCP forwarding (`gcloud compute ssh --tunnel-through-iap`).
resource "google_compute_firewall" "nats_iap_ssh" {
  name          = "${var.name}-nats-iap-ssh"
  network       = google_compute_network.main.id
  description   = "SSH to the NATS nodes through Identity-Aware Proxy only"
  source_ranges = ["35.235.240.0/20"]
  target_tags   = ["${var.name}-nats"]

  allow {
    protocol = "tcp"
    ports    = ["22"]
  }
}

# One name for the three NATS nodes: clients seed from it, then learn the cluster by gossip.
resource "google_dns_managed_zone" "internal" {
  name        = "${var.name}-internal"
  dns_name    = "${local.internal_zone}."
  description = "rollout internal names"
  visibility  = "private"

  private_visibility_config {
    networks {
      network_url = google_compute_network.main.id
    }
  }
}

resource "google_dns_record_set" "nats" {
  managed_zone = google_dns_managed_zone.internal.name
  name         = "${local.nats_host}."
  type         = "A"
  ttl          = 60
  rrdatas      = local.nats_ips
}

# ---------------------------------------------------------------------------------------------
# NATS: three Compute Engine nodes, JetStream on a persistent disk each, clustered over fixed
# internal IPs.

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

resource "google_service_account" "nats" {
  account_id   = "${var.name}-nats"
  display_name = "rollout NATS nodes"
}

resource "google_project_iam_member" "nats" {
  for_each = toset(["roles/logging.logWriter", "roles/monitoring.metricWriter"])
  project  = var.project_id
  role     = each.value
  member   = "serviceAccount:${google_service_account.nats.email}"
}

resource "google_compute_disk" "nats" {
  # checkov:skip=CKV_GCP_37: customer-supplied keys mean sending the raw key with every API call; the disk is encrypted at rest by Google
  count = 3
  name  = "${var.name}-nats-${count.index}"
  zone  = local.zones[count.index]
  type  = "pd-ssd"
  size  = var.nats_disk_gb

  depends_on = [google_project_service.apis]
}

resource "google_compute_instance" "nats" {
  # checkov:skip=CKV_GCP_38: customer-supplied keys mean sending the raw key with every API call; the disks are encrypted at rest by Google
  count        = 3
  name         = "${var.name}-nats-${count.index}"
  zone         = local.zones[count.index]
  machine_type = var.nats_machine_type
  tags         = ["${var.name}-nats"]

  boot_disk {
    initialize_params {
      image = "debian-cloud/debian-12"
      size  = 20
    }
  }

  attached_disk {
    source      = google_compute_disk.nats[count.index].id
    device_name = "jetstream"
  }

  network_interface {
    subnetwork = google_compute_subnetwork.main.id
    network_ip = local.nats_ips[count.index]
  }

  service_account {
    email  = google_service_account.nats.email
    scopes = ["cloud-platform"]
  }

  shielded_instance_config {
    enable_secure_boot = true
  }

  # Operators come in through IAP with OS Login; no project-wide SSH key reaches these nodes.
  metadata = {
    block-project-ssh-keys = "true"
    enable-oslogin         = "true"
  }

  # Runs on every boot, so each step is idempotent: format the disk once, install the pinned
  # nats-server when it is missing or another version, rewrite the config, (re)start.
  metadata_startup_script = <<-EOT
    #!/bin/bash
    set -euo pipefail
    dev=/dev/disk/by-id/google-jetstream
    blkid "$dev" || mkfs.ext4 -F "$dev"
    mkdir -p /var/lib/nats
    grep -q ' /var/lib/nats ' /etc/fstab || echo "$dev /var/lib/nats ext4 defaults,nofail 0 2" >> /etc/fstab
    mount -a
    id nats || useradd --system --home-dir /var/lib/nats --shell /usr/sbin/nologin nats
    chown nats:nats /var/lib/nats

    if ! /usr/local/bin/nats-server --version 2>/dev/null | grep -q 'v${var.nats_version}$'; then
      curl -fsSL -o /tmp/nats.tar.gz \
        https://github.com/nats-io/nats-server/releases/download/v${var.nats_version}/nats-server-v${var.nats_version}-linux-amd64.tar.gz
      tar -xzf /tmp/nats.tar.gz -C /tmp
      install -m 0755 /tmp/nats-server-v${var.nats_version}-linux-amd64/nats-server /usr/local/bin/nats-server
    fi

    install -d -m 0750 -o root -g nats /etc/nats
    cat > /etc/nats/nats.conf <<'CONF'
    server_name: ${var.name}-nats-${count.index}
    listen: 0.0.0.0:4222
    http: 0.0.0.0:8222
    jetstream {
      store_dir: /var/lib/nats
      max_file_store: ${floor(var.nats_disk_gb * 0.9)}G
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
    systemctl enable nats
    systemctl restart nats
  EOT

  # A new script or image must not replace all three nodes at once (JetStream would lose its
  # quorum); roll them one at a time with `terraform apply -replace='google_compute_instance.nats[N]'`.
  lifecycle {
    ignore_changes = [metadata_startup_script, boot_disk[0].initialize_params[0].image]
  }

  depends_on = [google_compute_router_nat.main]
}

# ---------------------------------------------------------------------------------------------
# Cloud SQL for PostgreSQL on a private IP (read models; rebuildable from the event log).

resource "google_compute_global_address" "private_services" {
  name          = "${var.name}-private-services"
  purpose       = "VPC_PEERING"
  address_type  = "INTERNAL"
  prefix_length = 16
  network       = google_compute_network.main.id
}

resource "google_service_networking_connection" "private_services" {
  network                 = google_compute_network.main.id
  service                 = "servicenetworking.googleapis.com"
  reserved_peering_ranges = [google_compute_global_address.private_services.name]
}

# Cloud SQL keeps a deleted instance's name for a week; a suffix lets a new stack reuse `name`.
resource "random_id" "postgres" {
  byte_length = 3
}

resource "random_password" "postgres" {
  length  = 32
  special = false
}

resource "google_sql_database_instance" "postgres" {
  # checkov:skip=CKV2_GCP_13: log_duration logs every statement's duration, which the projections' batched writes would flood; slow queries show in Query Insights
  # checkov:skip=CKV_GCP_6: ssl_mode ENCRYPTED_ONLY: every connection must use TLS; client certificates would have to be distributed to the pods, which authenticate by password over TLS
  # checkov:skip=CKV_GCP_79: var.postgres_version picks the major version; the default is the one the migrations are tested on
  name                = "${var.name}-postgres-${random_id.postgres.hex}"
  database_version    = var.postgres_version
  region              = var.region
  deletion_protection = var.deletion_protection

  settings {
    tier              = var.postgres_tier
    availability_type = var.postgres_high_availability ? "REGIONAL" : "ZONAL"
    disk_type         = "PD_SSD"
    disk_size         = var.postgres_disk_gb
    disk_autoresize   = true

    ip_configuration {
      ipv4_enabled    = false
      private_network = google_compute_network.main.id
      ssl_mode        = "ENCRYPTED_ONLY"
    }

    backup_configuration {
      enabled                        = true
      point_in_time_recovery_enabled = true
    }

    # Connections, locks, checkpoints, schema changes and errors are logged (pgAudit on);
    # every statement is not (the projections' writes would flood the log).
    database_flags {
      name  = "log_checkpoints"
      value = "on"
    }

    database_flags {
      name  = "log_connections"
      value = "on"
    }

    database_flags {
      name  = "log_disconnections"
      value = "on"
    }

    database_flags {
      name  = "log_lock_waits"
      value = "on"
    }

    database_flags {
      name  = "log_hostname"
      value = "on"
    }

    database_flags {
      name  = "log_min_error_statement"
      value = "error"
    }

    database_flags {
      name  = "log_statement"
      value = "ddl"
    }

    database_flags {
      name  = "cloudsql.enable_pgaudit"
      value = "on"
    }
  }

  depends_on = [google_service_networking_connection.private_services]
}

resource "google_sql_database" "rollout" {
  name     = "rollout"
  instance = google_sql_database_instance.postgres.name
}

resource "google_sql_user" "rollout" {
  name     = "rollout"
  instance = google_sql_database_instance.postgres.name
  password = random_password.postgres.result
}

# ---------------------------------------------------------------------------------------------
# GCS: checkpoints and large trajectory batches (claim check: events carry URI + sha256).

resource "google_storage_bucket" "artifacts" {
  # checkov:skip=CKV_GCP_62: access logs need a second bucket per deployment; Data Access audit logs are the operator's choice for auditing object reads
  name                        = local.bucket_name
  location                    = upper(var.region)
  force_destroy               = var.bucket_force_destroy
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"

  # Versioning guards checkpoints against an accidental delete; old versions expire.
  versioning {
    enabled = true
  }

  lifecycle_rule {
    condition {
      days_since_noncurrent_time = 30
    }
    action {
      type = "Delete"
    }
  }

  lifecycle_rule {
    condition {
      age = 7
    }
    action {
      type = "AbortIncompleteMultipartUpload"
    }
  }
}

# ---------------------------------------------------------------------------------------------
# GKE: the services run here. A CPU pool across three zones for tracker, env-registry, verifier
# and buffer; GPU pools (GKE taints them nvidia.com/gpu and installs the driver) for the actors
# and the learner.

resource "google_service_account" "nodes" {
  account_id   = "${var.name}-gke-nodes"
  display_name = "rollout GKE nodes"
}

resource "google_project_iam_member" "nodes" {
  for_each = toset([
    "roles/logging.logWriter",
    "roles/monitoring.metricWriter",
    "roles/monitoring.viewer",
    "roles/artifactregistry.reader",
  ])
  project = var.project_id
  role    = each.value
  member  = "serviceAccount:${google_service_account.nodes.email}"
}

resource "google_container_cluster" "main" {
  # checkov:skip=CKV_GCP_12: Dataplane V2 (datapath_provider ADVANCED_DATAPATH) enforces NetworkPolicy; the network_policy block is for the legacy Calico addon
  # checkov:skip=CKV_GCP_65: access is by IAM roles on the project; a Google Groups for RBAC domain is the organisation's choice
  # checkov:skip=CKV_GCP_66: images come from the operator's registry by tag or digest; a Binary Authorization policy is set per organisation
  # checkov:skip=CKV_GCP_69: the default node pool is removed at creation; every pool that runs (google_container_node_pool.pool) sets GKE_METADATA
  name                = var.name
  location            = var.region
  node_locations      = local.zones
  network             = google_compute_network.main.id
  subnetwork          = google_compute_subnetwork.main.id
  deletion_protection = var.deletion_protection

  # Node pools are managed below; the default one only exists while the cluster is created.
  remove_default_node_pool = true
  initial_node_count       = 1

  resource_labels = { app = "rollout", rollout-deployment = var.name }

  # Dataplane V2 enforces the manifests' NetworkPolicies; traffic between pods on one node is
  # visible to the VPC too.
  datapath_provider           = "ADVANCED_DATAPATH"
  enable_intranode_visibility = true

  master_auth {
    client_certificate_config {
      issue_client_certificate = false
    }
  }

  ip_allocation_policy {
    cluster_secondary_range_name  = "pods"
    services_secondary_range_name = "services"
  }

  private_cluster_config {
    enable_private_nodes    = true
    enable_private_endpoint = false
    master_ipv4_cidr_block  = var.master_cidr
  }

  master_authorized_networks_config {
    dynamic "cidr_blocks" {
      for_each = var.master_authorized_cidrs
      content {
        cidr_block = cidr_blocks.value
      }
    }
  }

  workload_identity_config {
    workload_pool = "${var.project_id}.svc.id.goog"
  }

  release_channel {
    channel = "REGULAR"
  }

  depends_on = [google_project_service.apis]
}

resource "google_container_node_pool" "pool" {
  for_each = local.node_pools

  name           = each.key
  cluster        = google_container_cluster.main.id
  location       = var.region
  node_locations = each.value.locations

  autoscaling {
    min_node_count = each.value.min
    max_node_count = each.value.max
  }

  management {
    auto_repair  = true
    auto_upgrade = true
  }

  node_config {
    machine_type    = each.value.machine_type
    spot            = each.value.spot
    disk_size_gb    = each.value.disk_gb
    disk_type       = "pd-balanced"
    service_account = google_service_account.nodes.email
    oauth_scopes    = ["https://www.googleapis.com/auth/cloud-platform"]
    labels          = { "rollout.dev/pool" = each.key }

    workload_metadata_config {
      mode = "GKE_METADATA"
    }

    shielded_instance_config {
      enable_secure_boot          = true
      enable_integrity_monitoring = true
    }

    dynamic "guest_accelerator" {
      for_each = each.value.gpu == null ? [] : [each.value.gpu]
      content {
        type  = guest_accelerator.value.type
        count = guest_accelerator.value.count

        gpu_driver_installation_config {
          gpu_driver_version = "LATEST"
        }
      }
    }
  }

  # The cluster autoscaler owns the node count once the pool exists.
  lifecycle {
    ignore_changes = [node_count, initial_node_count]
  }
}

# Bucket access for the rollout pods through Workload Identity: the Kubernetes service account
# acts as this Google service account (annotate it with iam.gke.io/gcp-service-account).
resource "google_service_account" "workload" {
  account_id   = "${var.name}-workload"
  display_name = "rollout services"
}

resource "google_storage_bucket_iam_member" "workload" {
  bucket = google_storage_bucket.artifacts.name
  role   = "roles/storage.objectAdmin"
  member = "serviceAccount:${google_service_account.workload.email}"
}

resource "google_service_account_iam_member" "workload_identity" {
  service_account_id = google_service_account.workload.name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${var.project_id}.svc.id.goog[${var.kubernetes_namespace}/${var.kubernetes_service_account}]"

  depends_on = [google_container_cluster.main]
}
