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

# No single-field indexes on any field the store writes: it reads documents by id only,
# and Firestore indexes every field by default, which costs an index write per field and
# caps a collection holding monotonically increasing indexed values (timestamps) near
# 500 writes/s. The TTL field is exempt above, or here when that policy is not managed.
resource "google_firestore_field" "unindexed" {
  for_each = local.store_backend == "firestore" ? toset(concat(
    local.store_unindexed_fields, var.manage_firestore_ttl ? [] : [local.ttl_field]
  )) : toset([])

  project    = local.store_project
  database   = local.store_database
  collection = local.store_collection
  field      = each.key

  index_config {}
}
