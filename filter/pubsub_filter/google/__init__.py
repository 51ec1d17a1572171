"""What the Google-facing modules share, below every surface and backend that talks to Google:
`shared` (resource paths, the project, the credentials message, transient errors, chunked
acks, Pub/Sub's timestamps) and `received` (a client's Pub/Sub message made the engine's
`Message`). Not a backend: nothing here implements a core port."""
