"""State stores: SQLite (embedded) and Firestore, behind `pubsub_filter.core.ports.StateStore`."""

#: The document field Firestore's TTL policy deletes on (a timestamp); Terraform names it too.
TTL_FIELD = "expires_at"
