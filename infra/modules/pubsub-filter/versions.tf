terraform {
  # 1.5: `check` blocks (used for the timing and delivery-attempt rules in config.tf).
  required_version = ">= 1.5.0"

  required_providers {
    google = {
      source = "hashicorp/google"
      # 6.0 added `deletion_protection` to google_cloud_run_v2_service; nothing used here
      # changed in 7.x or 8.x.
      version = ">= 6.0, < 9.0"
    }
  }
}
