# Optional (decision_log_sink = true): every decision line routed to BigQuery by a Cloud Logging
# sink, beside the decisions table the filter writes itself. The filter writes one line per
# decision to stdout before it answers, and Cloud Logging has it from then on, so a SIGKILL or
# an out-of-memory kill, which can lose the rows the recorder still batches (at most
# records.flush_interval of them), loses no line here. The sink writes day-partitioned tables
# named after the log, with the line's fields under jsonPayload. It reads every line the
# service writes, DEBUG included: the exclusion of quieted lines applies to the _Default sink only.

locals {
  decision_lines_dataset = coalesce(var.decision_log_dataset, "${replace(var.name, "-", "_")}_decision_lines")
}

resource "google_bigquery_dataset" "decision_lines" {
  count = var.decision_log_sink ? 1 : 0

  project       = var.project
  dataset_id    = local.decision_lines_dataset
  location      = var.region
  friendly_name = "pubsub-filter decision lines"
  description   = "Decision log lines of pubsub-filter (${var.name}), routed by a Cloud Logging sink."
  labels        = var.labels

  delete_contents_on_destroy = false

  dynamic "default_encryption_configuration" {
    for_each = var.kms_key_name == null ? [] : [var.kms_key_name]
    content {
      kms_key_name = default_encryption_configuration.value
    }
  }
}

resource "google_logging_project_sink" "decision_lines" {
  count = var.decision_log_sink ? 1 : 0

  project                = var.project
  name                   = "${var.name}-decision-lines"
  description            = "pubsub-filter ${var.name}: every decision line, to BigQuery."
  destination            = "bigquery.googleapis.com/projects/${var.project}/datasets/${google_bigquery_dataset.decision_lines[0].dataset_id}"
  filter                 = "${local.log_source} AND jsonPayload.message=\"decision\""
  unique_writer_identity = true

  bigquery_options {
    use_partitioned_tables = true
  }
}

resource "google_bigquery_dataset_iam_member" "decision_lines_writer" {
  count = var.decision_log_sink ? 1 : 0

  project    = var.project
  dataset_id = google_bigquery_dataset.decision_lines[0].dataset_id
  role       = "roles/bigquery.dataEditor"
  member     = google_logging_project_sink.decision_lines[0].writer_identity
}
