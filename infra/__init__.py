"""Everything a cluster stack is made of: the cluster spec, tiers, catalogs, cloud-init, providers."""
