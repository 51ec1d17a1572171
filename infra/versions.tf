terraform {
  required_version = ">= 1.5.0"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 6.0, < 9.0"
    }
  }

  # Keep state in a bucket for anything but a trial:
  # backend "gcs" {
  #   bucket = "nba-props-platform-tfstate"
  #   prefix = "pubsub-filter"
  # }
}
