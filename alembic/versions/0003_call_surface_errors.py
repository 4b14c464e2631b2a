"""calls.surface and calls.client; rollouts.errors

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-04 15:45:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable columns and a constant default: on both databases adding them rewrites no rows,
    # so a proxy that migrates a large records DB on start is not held up. Older calls keep a
    # NULL surface (reading every request body to derive it would rewrite the whole table).
    with op.batch_alter_table('calls', schema=None) as batch_op:
        batch_op.add_column(sa.Column('surface', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('client', sa.String(length=128), nullable=True))
    with op.batch_alter_table('rollouts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('errors', sa.Integer(), server_default='0', nullable=False))
        batch_op.create_index(batch_op.f('ix_rollouts_errors'), ['errors'], unique=False)
    # the failed calls already recorded, so compile treats older rollouts like new ones; a call
    # that ended after its rollout was finished (written then as a 409) is not the harness's error
    op.execute(
        "UPDATE rollouts SET errors = (SELECT count(*) FROM calls WHERE calls.rollout_id = rollouts.id "
        "AND calls.status = 'error' AND calls.error NOT LIKE '409 invalid_request_error: rollout % is finished%') "
        "WHERE id IN (SELECT rollout_id FROM calls WHERE status = 'error')"
    )


def downgrade() -> None:
    with op.batch_alter_table('rollouts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rollouts_errors'))
        batch_op.drop_column('errors')
    with op.batch_alter_table('calls', schema=None) as batch_op:
        batch_op.drop_column('client')
        batch_op.drop_column('surface')
