# The ROLLOUT_* values every service needs (docs/deploy.md). They resolve inside the VPC.

output "rollout_nats_url" {
  description = "ROLLOUT_NATS_URL: one name for the three nodes; clients learn the cluster by gossip."
  value       = "nats://${local.nats_host}:4222"
}

output "rollout_nats_user" {
  description = "ROLLOUT_NATS_USER."
  value       = var.nats_user
}

output "rollout_nats_password" {
  description = "ROLLOUT_NATS_PASSWORD."
  value       = random_password.nats.result
  sensitive   = true
}

output "rollout_service_nats_credentials" {
  description = "Each service's own NATS user and password (ROLLOUT_NATS_USER / ROLLOUT_NATS_PASSWORD), one Kubernetes Secret each."
  value = {
    for service in local.rollout_services : service => {
      ROLLOUT_NATS_USER     = "svc_${service}"
      ROLLOUT_NATS_PASSWORD = random_password.nats_service[service].result
    }
  }
  sensitive = true
}

output "rollout_database_url" {
  description = "ROLLOUT_DATABASE_URL (TLS required)."
  value       = "postgresql://rollout:${random_password.postgres.result}@${aws_db_instance.postgres.address}:${aws_db_instance.postgres.port}/rollout?sslmode=require"
  sensitive   = true
}

output "rollout_object_store_url" {
  description = "ROLLOUT_OBJECT_STORE_URL: where checkpoints and large trajectory batches go."
  value       = "s3://${aws_s3_bucket.artifacts.bucket}/rollout"
}

output "rollout_env" {
  description = "All ROLLOUT_* variables as one map, e.g. for a Kubernetes Secret."
  # ROLLOUT_STREAM_REPLICAS: the three NATS nodes each keep every stream (R3 survives one loss).
  value = {
    ROLLOUT_NATS_URL         = "nats://${local.nats_host}:4222"
    ROLLOUT_NATS_USER        = var.nats_user
    ROLLOUT_NATS_PASSWORD    = random_password.nats.result
    ROLLOUT_STREAM_REPLICAS  = "3"
    ROLLOUT_DATABASE_URL     = "postgresql://rollout:${random_password.postgres.result}@${aws_db_instance.postgres.address}:${aws_db_instance.postgres.port}/rollout?sslmode=require"
    ROLLOUT_OBJECT_STORE_URL = "s3://${aws_s3_bucket.artifacts.bucket}/rollout"
    AWS_REGION               = var.region
  }
  sensitive = true
}

output "nats_private_ips" {
  description = "Private addresses of the NATS nodes (monitoring on :8222)."
  value       = local.nats_ips
}

output "nats_instance_ids" {
  description = "EC2 instance ids of the NATS nodes (for `aws ssm start-session`)."
  value       = aws_instance.nats[*].id
}

output "bucket" {
  description = "S3 bucket for checkpoints and trajectories."
  value       = aws_s3_bucket.artifacts.bucket
}

output "eks_cluster_name" {
  description = "EKS cluster the services run on."
  value       = aws_eks_cluster.main.name
}

output "kubeconfig_command" {
  description = "Command that points kubectl at the cluster."
  value       = "aws eks update-kubeconfig --region ${var.region} --name ${aws_eks_cluster.main.name}"
}

output "kubernetes_service_account" {
  description = "namespace/name of the service account whose pods get bucket access."
  value       = "${var.kubernetes_namespace}/${var.kubernetes_service_account}"
}
