"""The engine: deciding (`judge`) and acting on a decision (claim, send under a heartbeat,
commit, record), its stop and its close."""
