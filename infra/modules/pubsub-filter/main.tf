# The Cloud Run service, its identities and its config file.

data "google_project" "this" {
  project_id = var.project
}

locals {
  # Planned emails (known before apply) for preconditions; the *_email locals below
  # reference the resources so that bindings wait for the accounts to exist.
  run_sa_planned_email  = coalesce(var.service_account_email, "${var.name}-run@${var.project}.iam.gserviceaccount.com")
  push_sa_planned_email = coalesce(var.push_service_account_email, "${var.name}-push@${var.project}.iam.gserviceaccount.com")
  run_sa_email          = var.service_account_email != null ? var.service_account_email : google_service_account.run[0].email
  push_sa_email         = var.push_service_account_email != null ? var.push_service_account_email : google_service_account.push[0].email

  # The Pub/Sub service agent: forwards to dead-letter topics and mints push OIDC tokens.
  pubsub_service_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"

  config_dir  = "/etc/pubsub-filter"
  config_file = "filter.yaml"
}

resource "google_service_account" "run" {
  count        = var.service_account_email == null ? 1 : 0
  project      = var.project
  account_id   = "${var.name}-run"
  display_name = "pubsub-filter service (${var.name})"
  description  = "Runs the pubsub-filter Cloud Run service: publishes to the destination topics, uses Firestore and writes BigQuery decision records."
}

resource "google_service_account" "push" {
  count        = var.push_service_account_email == null ? 1 : 0
  project      = var.project
  account_id   = "${var.name}-push"
  display_name = "pubsub-filter push identity (${var.name})"
  description  = "Identity in the OIDC token Pub/Sub attaches to push requests to pubsub-filter; may only invoke the service."
}

# --- the config file, mounted from Secret Manager --------------------------------------

resource "google_secret_manager_secret" "config" {
  project   = var.project
  secret_id = "${var.name}-config"
  labels    = var.labels

  replication {
    auto {}
  }
}

# Each config change is a new secret version; the service mounts that exact version, so
# applying a config change rolls out a new revision (and rolls back with it).
resource "google_secret_manager_secret_version" "config" {
  secret      = google_secret_manager_secret.config.id
  secret_data = var.config_yaml
}

resource "google_secret_manager_secret_iam_member" "run_reads_config" {
  project   = var.project
  secret_id = google_secret_manager_secret.config.secret_id
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${local.run_sa_email}"
}

# --- the service -------------------------------------------------------------------------

resource "google_cloud_run_v2_service" "this" {
  project             = var.project
  name                = var.name
  location            = var.region
  ingress             = var.ingress
  deletion_protection = var.deletion_protection
  labels              = var.labels

  # Cloud Run accepts an ID token whose audience is the service URL or one of these.
  custom_audiences = local.auth_audience == null ? null : [local.auth_audience]

  template {
    service_account                  = local.run_sa_email
    timeout                          = "${local.request_timeout_seconds}s"
    max_instance_request_concurrency = var.concurrency
    execution_environment            = "EXECUTION_ENVIRONMENT_GEN2"
    labels                           = var.labels

    scaling {
      min_instance_count = var.min_instances
      max_instance_count = var.max_instances
    }

    containers {
      name  = "pubsub-filter"
      image = var.image
      # ENTRYPOINT ["pubsub-filter"], CMD ["serve"] come from the image; Cloud Run sets
      # $PORT from container_port and the app listens on it.

      ports {
        container_port = 8080
      }

      env {
        name  = "PUBSUB_FILTER_CONFIG"
        value = "${local.config_dir}/${local.config_file}"
      }

      # Quieted decision lines (config.tf: decision_lines_quieted) are written at debug and
      # excluded from Cloud Logging's storage, so the log-based metrics still count them.
      dynamic "env" {
        for_each = local.service_log_level == null ? [] : [local.service_log_level]
        content {
          name  = "LOG_LEVEL"
          value = env.value
        }
      }

      resources {
        limits = {
          cpu    = var.cpu
          memory = var.memory
        }
        cpu_idle          = !var.cpu_always_allocated
        startup_cpu_boost = true
      }

      volume_mounts {
        name       = "config"
        mount_path = local.config_dir
      }

      # /healthz answers without touching the store (/readyz pings it): a Firestore
      # outage must not restart instances that are failing open by design.
      startup_probe {
        period_seconds    = 2
        timeout_seconds   = 1
        failure_threshold = 30
        http_get {
          path = "/healthz"
        }
      }

      liveness_probe {
        period_seconds    = 30
        timeout_seconds   = 5
        failure_threshold = 3
        http_get {
          path = "/healthz"
        }
      }
    }

    volumes {
      name = "config"
      secret {
        secret = google_secret_manager_secret.config.secret_id
        items {
          version = google_secret_manager_secret_version.config.version
          path    = local.config_file
          mode    = 292 # 0444: read by the image's non-root user
        }
      }
    }
  }

  lifecycle {
    precondition {
      condition     = local.auth_service_account == null || local.auth_service_account == local.push_sa_planned_email
      error_message = "The config's auth.service_account (${coalesce(local.auth_service_account, "-")}) is not the push service account (${local.push_sa_planned_email}): the filter would refuse every push. Fix the config or set push_service_account_email."
    }
    precondition {
      condition     = local.lease.duration > local.lease.ack_deadline && local.lease.ack_deadline > local.lease.heartbeat
      error_message = "The config needs lease.duration > lease.ack_deadline > lease.heartbeat (got ${local.lease.duration}s, ${local.lease.ack_deadline}s, ${local.lease.heartbeat}s)."
    }
  }

  depends_on = [google_secret_manager_secret_iam_member.run_reads_config]
}

# No allUsers/allAuthenticatedUsers binding: only the push identity may invoke the service.
resource "google_cloud_run_v2_service_iam_member" "push_invoker" {
  project  = var.project
  location = var.region
  name     = google_cloud_run_v2_service.this.name
  role     = "roles/run.invoker"
  member   = "serviceAccount:${local.push_sa_email}"
}
