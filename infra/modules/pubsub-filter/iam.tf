# Least privilege, resource by resource where the API allows it.

# --- the Pub/Sub service agent -------------------------------------------------------
# Dead-lettering needs the agent to publish to the dead-letter topic and to ack the
# message on the source subscription; push authentication needs it to mint OIDC tokens
# for the push service account.

resource "google_pubsub_topic_iam_member" "service_agent_publishes_dead_letter" {
  for_each = local.routes

  project = var.project
  topic   = google_pubsub_topic.dead_letter[each.key].name
  role    = "roles/pubsub.publisher"
  member  = local.pubsub_service_agent
}

resource "google_pubsub_subscription_iam_member" "service_agent_subscribes_source" {
  for_each = local.routes

  project      = var.project
  subscription = google_pubsub_subscription.push[each.key].name
  role         = "roles/pubsub.subscriber"
  member       = local.pubsub_service_agent
}

resource "google_service_account_iam_member" "service_agent_mints_push_tokens" {
  service_account_id = (
    var.push_service_account_email == null ? google_service_account.push[0].name :
    "projects/${try(regex("@([a-z0-9-]+)\\.iam\\.gserviceaccount\\.com$", var.push_service_account_email)[0], var.project)}/serviceAccounts/${var.push_service_account_email}"
  )
  role   = "roles/iam.serviceAccountTokenCreator"
  member = local.pubsub_service_agent
}

# --- the service's own identity ---------------------------------------------------------

resource "google_pubsub_topic_iam_member" "run_publishes_destination" {
  for_each = local.destinations

  project = each.value.project
  topic   = var.create_destination_topics ? google_pubsub_topic.destination[each.key].name : each.value.name
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${local.run_sa_email}"
}

# Firestore IAM is project-wide: there is no per-collection role.
resource "google_project_iam_member" "run_uses_firestore" {
  count = local.store_backend == "firestore" ? 1 : 0

  project = local.store_project
  role    = "roles/datastore.user"
  member  = "serviceAccount:${local.run_sa_email}"
}

resource "google_bigquery_dataset_iam_member" "run_writes_decisions" {
  count = local.records_backend == "bigquery" ? 1 : 0

  project    = local.records_project
  dataset_id = google_bigquery_dataset.dataset["records"].dataset_id
  role       = "roles/bigquery.dataEditor"
  member     = "serviceAccount:${local.run_sa_email}"
}

# The skip-rate query (`pubsub-filter skip-rate` run as this account) is a query job;
# job creation is a project-level permission.
resource "google_project_iam_member" "run_runs_bigquery_jobs" {
  count = local.records_backend == "bigquery" ? 1 : 0

  project = local.records_project
  role    = "roles/bigquery.jobUser"
  member  = "serviceAccount:${local.run_sa_email}"
}
