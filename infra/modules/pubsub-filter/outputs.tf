output "service_url" {
  description = "URL of the Cloud Run service (push endpoints are <url>/push/<route>)."
  value       = google_cloud_run_v2_service.this.uri
}

output "service_name" {
  description = "Name of the Cloud Run service (resource.labels.service_name in its logs)."
  value       = google_cloud_run_v2_service.this.name
}

output "subscriptions" {
  description = "Route name -> push subscription id."
  value       = { for k, s in google_pubsub_subscription.push : k => s.id }
}

output "push_endpoints" {
  description = "Route name -> push endpoint URL."
  value       = { for k, s in google_pubsub_subscription.push : k => s.push_config[0].push_endpoint }
}

output "dead_letter_topics" {
  description = "Route name -> dead-letter topic id."
  value       = { for k, t in google_pubsub_topic.dead_letter : k => t.id }
}

output "dead_letter_subscriptions" {
  description = "Route name -> pull subscription on the dead-letter topic (what `pubsub-filter replay` reads)."
  value       = { for k, s in google_pubsub_subscription.dead_letter : k => s.id }
}

output "destination_topics" {
  description = "Destination topic ids (created here unless create_destination_topics = false)."
  value       = [for d in local.destinations : "projects/${d.project}/topics/${d.name}"]
}

output "service_account_email" {
  description = "Service account the service runs as."
  value       = local.run_sa_email
}

output "push_service_account_email" {
  description = "Service account in the push OIDC tokens (the config's auth.service_account)."
  value       = local.push_sa_email
}

output "push_audience" {
  description = "Audience of the push OIDC tokens."
  value       = coalesce(local.auth_audience, google_cloud_run_v2_service.this.uri)
}

output "max_delivery_attempts" {
  description = "max_delivery_attempts set on every push subscription, and the contention floor it covers."
  value = {
    value               = local.max_delivery_attempts
    contention_attempts = local.contention_attempts
  }
}

output "decisions_table" {
  description = "BigQuery decisions table as project.dataset.table (null when records are not on BigQuery)."
  value       = local.records_backend == "bigquery" ? "${local.records_project}.${google_bigquery_table.decisions[0].dataset_id}.${google_bigquery_table.decisions[0].table_id}" : null
}

output "decision_lines_dataset" {
  description = "BigQuery dataset the decision-line log sink writes to, as project.dataset (null unless decision_log_sink)."
  value       = var.decision_log_sink ? "${var.project}.${google_bigquery_dataset.dataset["decision_lines"].dataset_id}" : null
}

output "config_secret" {
  description = "Secret Manager secret holding the config, and the version the service mounts."
  value = {
    secret  = google_secret_manager_secret.config.id
    version = google_secret_manager_secret_version.config.version
  }
}
