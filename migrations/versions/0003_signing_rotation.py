"""Signing-secret rotation and API-key revocation.

owners.previous_signing_secret keeps signing next to the new secret until
owners.previous_secret_until (`punctual keys rotate`), so receivers can switch
without a call they cannot verify. api_keys.revoked_at ends a key
(`punctual keys revoke`) and keeps it listed.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

from app.registry.schema import UTCDateTime

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("owners") as batch:
        batch.add_column(sa.Column("previous_signing_secret", sa.Text(), nullable=True))
        batch.add_column(sa.Column("previous_secret_until", UTCDateTime(), nullable=True))
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("revoked_at", UTCDateTime(), nullable=True))
