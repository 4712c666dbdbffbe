"""AWS: EC2 nodes in one VPC subnet and cluster placement group, jumbo frames, an EC2 API preflight."""

from __future__ import annotations

from pathlib import Path

from fatpipe.infra.errors import FatpipeError

from .base import Provider


class Aws(Provider):
    name = "aws"
    mtu = 9001  # jumbo frames inside a VPC; the internet gateway path falls back by path-MTU discovery
    user_data_limit = 16 * 1024  # EC2 refuses more

    def construct(self, scope, cluster, project):
        from .aws_stack import AwsClusterConstruct

        return AwsClusterConstruct(scope, "cluster_resources", cluster=cluster,
                                   machine=self.machine(cluster, project.root),
                                   user_data=self.user_data(cluster))

    def preflight(self, cluster, project) -> None:
        from .aws_api import preflight  # boto3: only for AWS clusters

        preflight(cluster, root=project.root)

    def refresh_catalog(self, region: str, root: Path) -> Path:
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        from .aws_api import refresh_aws_catalog

        try:
            return refresh_aws_catalog(region, root)
        except NoCredentialsError:
            raise FatpipeError("no AWS credentials found: set AWS_PROFILE or run `aws configure` "
                               "(or use --offline)") from None
        except ClientError as e:
            error = e.response.get("Error", {})
            raise FatpipeError(f"EC2 refused DescribeInstanceTypes in {region}: "
                               f"{error.get('Code')}: {error.get('Message')}") from None
        except BotoCoreError as e:
            raise FatpipeError(f"cannot reach EC2 in {region}: {e}") from None


AWS = Aws()
