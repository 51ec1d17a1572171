output "routes" {
  description = "Route name -> destination, as read from the config."
  value       = { for r in local.config.routes : r.name => r.destination }
}

output "service_url" {
  description = "URL of the Cloud Run service."
  value       = module.pubsub_filter.service_url
}

output "subscriptions" {
  description = "Route name -> push subscription id."
  value       = module.pubsub_filter.subscriptions
}

output "dead_letter_topics" {
  description = "Route name -> dead-letter topic id."
  value       = module.pubsub_filter.dead_letter_topics
}

output "dead_letter_subscriptions" {
  description = "Route name -> dead-letter pull subscription id (for pubsub-filter replay)."
  value       = module.pubsub_filter.dead_letter_subscriptions
}

output "max_delivery_attempts" {
  description = "max_delivery_attempts on the push subscriptions and the contention floor it covers."
  value       = module.pubsub_filter.max_delivery_attempts
}

output "decisions_table" {
  description = "BigQuery decisions table (project.dataset.table)."
  value       = module.pubsub_filter.decisions_table
}

output "service_account_email" {
  description = "Service account the service runs as."
  value       = module.pubsub_filter.service_account_email
}

output "push_service_account_email" {
  description = "Service account in the push OIDC tokens."
  value       = module.pubsub_filter.push_service_account_email
}

output "decision_lines_dataset" {
  description = "BigQuery dataset the decision-line log sink writes to (null unless decision_log_sink)."
  value       = module.pubsub_filter.decision_lines_dataset
}
