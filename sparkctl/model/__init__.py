"""The data: schema, profiles, inventory, layout, run record. Pure: no SSH, no clock, no printing."""
