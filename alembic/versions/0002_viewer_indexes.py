"""indexes the trace viewer filters and sorts on

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 19:00:00
"""
from alembic import op


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('rollouts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rollouts_created_at'), ['created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_rollouts_status'), ['status'], unique=False)
    with op.batch_alter_table('rewards', schema=None) as batch_op:
        batch_op.create_index('ix_rewards_kind_value', ['kind', 'value'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('rewards', schema=None) as batch_op:
        batch_op.drop_index('ix_rewards_kind_value')
    with op.batch_alter_table('rollouts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rollouts_status'))
        batch_op.drop_index(batch_op.f('ix_rollouts_created_at'))
