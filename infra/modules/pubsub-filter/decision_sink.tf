# Optional (decision_log_sink = true): every decision line routed to BigQuery by a Cloud Logging
# sink, beside the decisions table the filter writes itself. The filter writes one line per
# decision to stdout before it answers, and Cloud Logging has it from then on, so a SIGKILL or
# an out-of-memory kill, which can lose the rows the recorder still batches (at most
# records.flush_interval of them), loses no line here. The sink writes day-partitioned tables
# named after the log, with the line's fields under jsonPayload. It reads every line the
# service writes, DEBUG included: the exclusion of quieted lines applies to the _Default sink only.

resource "google_logging_project_sink" "decision_lines" {
  count = var.decision_log_sink ? 1 : 0

  project                = var.project
  name                   = "${var.name}-decision-lines"
  description            = "pubsub-filter ${var.name}: every decision line, to BigQuery."
  destination            = "bigquery.googleapis.com/projects/${var.project}/datasets/${google_bigquery_dataset.dataset["decision_lines"].dataset_id}"
  filter                 = "${local.log_source} AND jsonPayload.message=\"decision\""
  unique_writer_identity = true

  bigquery_options {
    use_partitioned_tables = true
  }
}

resource "google_bigquery_dataset_iam_member" "decision_lines_writer" {
  count = var.decision_log_sink ? 1 : 0

  project    = var.project
  dataset_id = google_bigquery_dataset.dataset["decision_lines"].dataset_id
  role       = "roles/bigquery.dataEditor"
  member     = google_logging_project_sink.decision_lines[0].writer_identity
}
