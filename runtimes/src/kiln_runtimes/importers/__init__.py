"""Model importers: turn packaged upstream weights into built Kiln model folders."""
