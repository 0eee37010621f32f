"""Skiplock's schema as a step of the shop's migrations, so `manage.py migrate` (and the test
runner's test database) has it; `skiplock migrate` on the same database does the same."""

from django.db import migrations

import skiplock


def create_skiplock_schema(apps, schema_editor) -> None:
    skiplock.migrate(schema_editor.connection.connection)  # Django's psycopg connection


class Migration(migrations.Migration):
    atomic = False  # skiplock.migrate runs its own transaction
    dependencies = [("shop", "0001_initial")]
    operations = [migrations.RunPython(create_skiplock_schema, migrations.RunPython.noop)]
