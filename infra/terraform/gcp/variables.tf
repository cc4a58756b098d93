variable "project_id" {
  description = "GCP project to deploy into."
  type        = string
}

variable "name" {
  description = "Prefix of every resource name; one deployment per name."
  type        = string
  default     = "rollout"

  validation {
    # Service account ids ("<name>-gke-nodes") may not exceed 30 characters.
    condition     = can(regex("^[a-z][a-z0-9-]{1,15}$", var.name))
    error_message = "name must be 2-16 characters: lower-case letters, digits and '-', starting with a letter."
  }
}

variable "region" {
  description = "GCP region."
  type        = string
  default     = "us-central1"
}

variable "zones" {
  description = "Three zones of the region for the NATS nodes and the CPU node pool; empty means the first three."
  type        = list(string)
  default     = []

  validation {
    condition     = length(var.zones) == 0 || length(var.zones) == 3
    error_message = "zones must list exactly three zones, or be empty."
  }
}

variable "gpu_zone" {
  description = "Zone of the GPU node pools (GPU types differ between zones); empty means the first zone."
  type        = string
  default     = ""
}

variable "labels" {
  description = "Extra labels on every resource."
  type        = map(string)
  default     = {}
}

variable "subnet_cidr" {
  description = "Primary range of the subnet (nodes, NATS instances)."
  type        = string
  default     = "10.40.0.0/20"
}

variable "pods_cidr" {
  description = "Secondary range for GKE pods."
  type        = string
  default     = "10.48.0.0/14"
}

variable "services_cidr" {
  description = "Secondary range for GKE services."
  type        = string
  default     = "10.52.0.0/20"
}

variable "master_cidr" {
  description = "/28 for the GKE control plane's private endpoint."
  type        = string
  default     = "172.16.0.0/28"
}

variable "master_authorized_cidrs" {
  description = "CIDRs allowed to reach the GKE API endpoint (kubectl)."
  type        = list(string)
  default     = ["0.0.0.0/0"]
}

# NATS: three instances, one per zone, with JetStream on a persistent disk each.
variable "nats_version" {
  description = "nats-server release installed on the NATS instances."
  type        = string
  default     = "2.11.4"
}

variable "nats_machine_type" {
  description = "Machine type of each NATS node."
  type        = string
  default     = "n2-standard-2"
}

variable "nats_disk_gb" {
  description = "Size of each NATS node's JetStream disk (GiB)."
  type        = number
  default     = 100
}

variable "nats_user" {
  description = "NATS user the services and the CLI connect as (ROLLOUT_NATS_USER)."
  type        = string
  default     = "rollout"
}

# Postgres (read models).
variable "postgres_version" {
  description = "Cloud SQL database version."
  type        = string
  default     = "POSTGRES_16"
}

variable "postgres_tier" {
  description = "Cloud SQL machine tier."
  type        = string
  default     = "db-custom-2-7680"
}

variable "postgres_disk_gb" {
  description = "Initial disk size of the database (GiB); it grows on its own."
  type        = number
  default     = 50
}

variable "postgres_high_availability" {
  description = "Regional (HA) instance instead of zonal."
  type        = bool
  default     = false
}

variable "deletion_protection" {
  description = "Refuse to destroy the database and the cluster; turn off for throwaway stacks."
  type        = bool
  default     = true
}

# Object store (checkpoints, trajectory batches).
variable "bucket_name" {
  description = "GCS bucket name; empty means \"<project>-<name>-artifacts\"."
  type        = string
  default     = ""
}

variable "bucket_force_destroy" {
  description = "Let `terraform destroy` delete a bucket that still holds checkpoints."
  type        = bool
  default     = false
}

# Kubernetes (the services run here).
variable "system_machine_type" {
  description = "Machine type of the CPU node pool (tracker, env-registry, verifier, buffer)."
  type        = string
  default     = "e2-standard-4"
}

variable "system_nodes_per_zone" {
  description = "Autoscaling range of the CPU node pool, per zone."
  type        = object({ min = number, max = number })
  default     = { min = 1, max = 3 }
}

variable "actor_machine_type" {
  description = "Machine type of the actor GPU node pool."
  type        = string
  default     = "g2-standard-8"
}

variable "actor_gpu" {
  description = "Accelerator of each actor node."
  type        = object({ type = string, count = number })
  default     = { type = "nvidia-l4", count = 1 }
}

variable "actor_nodes" {
  description = "Autoscaling range of the actor node pool (scale to zero when idle)."
  type        = object({ min = number, max = number })
  default     = { min = 0, max = 8 }
}

variable "actor_spot" {
  description = "Spot VMs for actors (their work is redelivered when a node goes)."
  type        = bool
  default     = false
}

variable "learner_machine_type" {
  description = "Machine type of the learner GPU node pool."
  type        = string
  default     = "a2-highgpu-1g"
}

variable "learner_gpu" {
  description = "Accelerator of each learner node."
  type        = object({ type = string, count = number })
  default     = { type = "nvidia-tesla-a100", count = 1 }
}

variable "learner_nodes" {
  description = "Autoscaling range of the learner node pool."
  type        = object({ min = number, max = number })
  default     = { min = 0, max = 2 }
}

variable "kubernetes_namespace" {
  description = "Namespace the rollout services run in (their service account gets bucket access)."
  type        = string
  default     = "rollout"
}

variable "kubernetes_service_account" {
  description = "Kubernetes service account of the rollout pods."
  type        = string
  default     = "rollout"
}

variable "image_repository" {
  description = "Registry and name of the rollout image (infra/images/Dockerfile), without the tag."
  type        = string
}

variable "image_tag" {
  description = "Tag of the base image; the train and gpu variants are tagged <tag>-train and <tag>-gpu."
  type        = string
}

variable "cert_manager_version" {
  description = "cert-manager Helm chart version (issues the NATS certificates)."
  type        = string
  default     = "v1.19.1"
}

variable "external_secrets_version" {
  description = "External Secrets Operator Helm chart version (external-secrets.io/v1 API)."
  type        = string
  default     = "0.20.4"
}

variable "keda_version" {
  description = "KEDA Helm chart version (autoscales the actors on their work queue)."
  type        = string
  default     = "2.18.1"
}
