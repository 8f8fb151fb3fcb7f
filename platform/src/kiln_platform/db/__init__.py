"""Database: embedded or external PostgreSQL, tables, migrations, sessions."""
