"""Commented fatpipe.toml templates written by `fatpipe init`; the sim one is the embedded default."""

SIM = '''\
# fatpipe.toml: the clusters fatpipe can stand up, and defaults for the built-in trainer.
# Every key is checked when fatpipe reads this file; `fatpipe config` shows what it resolved.

[clusters.demo]
provider = "sim"        # sim | aws | digitalocean
nodes = 4               # 1..512
tier = "1g"             # 1g | 10g | 25g: the bandwidth every node must reach on the private link
isolation = "auto"      # sim only: netns (root: real links shaped with tc) | loopback (no root) | auto
# private_cidr = "10.42.0.0/24"   # node i gets .10+i
# rdzv_port = 29400

[train]                 # defaults for the built-in trainer; command-line flags override
preset = "small"        # tiny (~1M params) | small (~25M) | 124m (GPT-2 small)
steps = 200
comm = "auto"           # auto | none | bf16 | fp16 | powersgd
# batch_size = 8        # per rank, per micro-step
# seq_len = 256         # default 256; 1024 for 124m on GPT-2 tokens
# grad_accum = 1
# checkpoint_every = 50
# data = "corpus/"      # token shards (.bin, nanoGPT or llm.c) or text (as bytes); default: Python's own
'''

AWS = '''\
# fatpipe.toml: an AWS cluster in one placement group on a private VPC subnet.

[clusters.aws]
provider = "aws"
region = "us-east-1"
# regions = ["us-east-1", "us-west-2"]  # nodes across regions (the first is `region`), peered;
                                        # then set max_rtt_ms to the round trip between them
nodes = 4
tier = "10g"                          # 1g | 10g | 25g, judged on baseline (not burst) bandwidth
# instance_type = "c5n.2xlarge"       # default: the cheapest type whose baseline meets the tier
gpus_per_node = 0
ssh_public_key = "~/.ssh/id_ed25519.pub"
ssh_cidr = "203.0.113.7/32"           # who may SSH in: put your own address here
# private_cidr = "10.42.0.0/24"
# [clusters.aws.backend]              # default: local state under .fatpipe/aws/
# type = "s3"
# bucket = "my-terraform-state"
# key = "fatpipe/aws.tfstate"
# region = "us-east-1"

[train]
preset = "small"
steps = 200
comm = "auto"
'''

DIGITALOCEAN = '''\
# fatpipe.toml: a DigitalOcean cluster of droplets in one VPC.

[clusters.do]
provider = "digitalocean"
region = "nyc3"
nodes = 4
tier = "1g"
# size = "c-4"                        # default: the cheapest size that meets the tier
ssh_public_key = "~/.ssh/id_ed25519.pub"
ssh_cidr = "203.0.113.7/32"           # who may SSH in: put your own address here
# ssh_key_fingerprint = "3b:16:..."   # a key already on your account (DigitalOcean refuses a duplicate)
# private_cidr = "10.42.0.0/24"

[train]
preset = "small"
steps = 200
comm = "auto"
'''

SSH = '''\
# fatpipe.toml: machines you already rent, reached over SSH. fatpipe tunes them on deploy and
# hands them back as they were on down; it never creates or deletes a machine.

[clusters.rented]
provider = "ssh"
tier = "1g"                           # 1g | 10g | 25g: what the private links must carry
ssh_user = "root"                     # the default login; a login that is not root needs passwordless sudo
# ssh_key_file = "~/.ssh/id_ed25519"  # default: what ssh itself uses (~/.ssh/config, agent)
# mtu = 1400                          # default: the private NIC's MTU is left as it is
# install_packages = true             # apt-get iperf3, rsync, python3-venv, ... where apt exists
# firewall = true                     # only SSH from outside the private network; false opts out
# public_private_ips = false          # true: a private_ip outside RFC 1918 and 100.64.0.0/10 is meant

[[clusters.rented.hosts]]
address = "203.0.113.10"              # what ssh dials: an IP, a name, or a ~/.ssh/config alias
private_ip = "10.0.0.10"              # the host's address on the fast private network
# port = 22
# user = "ubuntu"

[[clusters.rented.hosts]]
address = "203.0.113.11"
private_ip = "10.0.0.11"

[train]
preset = "small"
steps = 200
comm = "auto"
'''

TEMPLATES = {"sim": SIM, "aws": AWS, "digitalocean": DIGITALOCEAN, "ssh": SSH}
