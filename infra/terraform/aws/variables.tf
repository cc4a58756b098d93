variable "name" {
  description = "Prefix of every resource name; one deployment per name."
  type        = string
  default     = "rollout"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,20}$", var.name))
    error_message = "name must be 2-21 characters: lower-case letters, digits and '-', starting with a letter."
  }
}

variable "region" {
  description = "AWS region."
  type        = string
  default     = "us-east-1"
}

variable "tags" {
  description = "Extra tags on every resource."
  type        = map(string)
  default     = {}
}

variable "vpc_cidr" {
  description = "CIDR of the VPC; split into three public and three private subnets."
  type        = string
  default     = "10.40.0.0/16"
}

# NATS: three instances, one per availability zone, with JetStream on a dedicated EBS volume.
variable "nats_version" {
  description = "nats-server release installed on the NATS instances."
  type        = string
  default     = "2.11.4"
}

variable "nats_instance_type" {
  description = "EC2 instance type of each NATS node."
  type        = string
  default     = "m6i.large"
}

variable "nats_volume_gb" {
  description = "Size of each NATS node's JetStream volume (GiB)."
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
  description = "RDS PostgreSQL engine version."
  type        = string
  default     = "16"
}

variable "postgres_instance_class" {
  description = "RDS instance class."
  type        = string
  default     = "db.t4g.medium"
}

variable "postgres_storage_gb" {
  description = "Allocated storage of the database (GiB); it grows up to 4x on its own."
  type        = number
  default     = 50
}

variable "postgres_multi_az" {
  description = "Run a standby in a second zone."
  type        = bool
  default     = false
}

variable "deletion_protection" {
  description = "Refuse to destroy the database and keep a final snapshot; turn off for throwaway stacks."
  type        = bool
  default     = true
}

# Object store (checkpoints, trajectory batches).
variable "bucket_name" {
  description = "S3 bucket name; empty means \"<name>-artifacts-<account id>\"."
  type        = string
  default     = ""
}

variable "bucket_force_destroy" {
  description = "Let `terraform destroy` delete a bucket that still holds checkpoints."
  type        = bool
  default     = false
}

# Kubernetes (the services run here).
variable "kubernetes_version" {
  description = "EKS Kubernetes version."
  type        = string
  default     = "1.34"
}

variable "system_instance_types" {
  description = "Instance types of the CPU node group (tracker, env-registry, verifier, buffer)."
  type        = list(string)
  default     = ["m6i.xlarge"]
}

variable "system_nodes" {
  description = "Size of the CPU node group."
  type        = object({ min = number, desired = number, max = number })
  default     = { min = 2, desired = 2, max = 6 }
}

variable "actor_instance_types" {
  description = "GPU instance types of the actor node group."
  type        = list(string)
  default     = ["g6.xlarge"]
}

variable "actor_nodes" {
  description = "Size of the actor node group (scale to zero when idle)."
  type        = object({ min = number, desired = number, max = number })
  default     = { min = 0, desired = 1, max = 8 }
}

variable "learner_instance_types" {
  description = "GPU instance types of the learner node group."
  type        = list(string)
  default     = ["g6e.2xlarge"]
}

variable "learner_nodes" {
  description = "Size of the learner node group."
  type        = object({ min = number, desired = number, max = number })
  default     = { min = 0, desired = 1, max = 2 }
}

variable "gpu_capacity_type" {
  description = "ON_DEMAND or SPOT for the GPU node groups (actors tolerate spot: their work is redelivered)."
  type        = string
  default     = "ON_DEMAND"

  validation {
    condition     = contains(["ON_DEMAND", "SPOT"], var.gpu_capacity_type)
    error_message = "gpu_capacity_type must be ON_DEMAND or SPOT."
  }
}

variable "eks_public_access_cidrs" {
  description = "CIDRs allowed to reach the EKS API endpoint from the internet (kubectl); [] makes it private only."
  type        = list(string)
  default     = ["0.0.0.0/0"]
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
