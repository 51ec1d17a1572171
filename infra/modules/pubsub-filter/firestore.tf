# Old key state deletes itself: the store writes `expires_at` on every document (last
# forward + config state_ttl) and Firestore's TTL policy removes documents past it,
# usually within 24 hours of expiry, at no request cost.

resource "google_firestore_field" "ttl" {
  count = var.manage_firestore_ttl && local.store_backend == "firestore" ? 1 : 0

  project    = local.store_project
  database   = local.store_database
  collection = local.store_collection
  field      = local.ttl_field

  ttl_config {}

  # No single-field indexes on the expiry timestamp: nothing queries it, and an index on
  # a monotonically increasing value is a write hotspot.
  index_config {}
}
