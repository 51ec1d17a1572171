"""The consumer's store for `pubsub_filter.consumer.fence`: SQLite (one file) or Firestore, behind `FenceStore`."""
