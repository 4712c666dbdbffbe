"""The CDKTF app: reads fatpipe.toml and builds one TerraformStack per cluster."""
