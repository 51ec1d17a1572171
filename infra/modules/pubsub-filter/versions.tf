terraform {
  # 1.5: the oldest Terraform the module is checked with. The timing and delivery-attempt rules
  # are lifecycle preconditions (main.tf, pubsub.tf); `endswith()` in validations needs 1.3.
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
