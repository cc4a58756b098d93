"""The bus: JetStream streams and consumers, event publishing, dead-lettering."""
