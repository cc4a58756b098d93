"""Postgres read models: migrations, the projection runner, rebuild."""
