from setuptools import find_packages, setup

PACKAGE = 'uq_autonomy'

setup(
    name=PACKAGE,
    version='0.1.0',
    packages=find_packages(exclude=['test']),
    data_files=[
        ('share/ament_index/resource_index/packages', [f'resource/{PACKAGE}']),
        (f'share/{PACKAGE}', ['package.xml']),
    ],
    install_requires=['setuptools'],
    zip_safe=True,
    maintainer='UQ Autonomy Team',
    maintainer_email='team@uq-autonomy.dev',
    description='Shared-autonomy arbitration and ask-for-help nodes.',
    license='Apache-2.0',
    entry_points={
        'console_scripts': [
            'arbitration_node = uq_autonomy.arbitration_node:main',
            'ask_for_help_node = uq_autonomy.ask_for_help_node:main',
            'reach_policy_node = uq_autonomy.reach_policy_node:main',
        ],
        # Subcommands of `uq` (uq_common.cli): the name is the command path with dots
        # ("bench.gp" is `uq bench gp`), the value a function that fills an argparse parser.
        'uq.commands': [
            'labels.list = uq_autonomy.labels.cli:configure_list',
            'labels.export = uq_autonomy.labels.cli:configure_export',
            'labels.import = uq_autonomy.labels.cli:configure_import',
            'labels.serve = uq_autonomy.labels.cli:configure_serve',
        ],
    },
)
