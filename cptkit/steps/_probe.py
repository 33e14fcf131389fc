from dataclasses import dataclass, field
from cptkit.config import JobConfig, register_step
from cptkit.job import Job

@dataclass
class ProbeConfig:
    tag: str = "x"

@dataclass
class ProbeJob(JobConfig):
    probe: ProbeConfig = field(default_factory=ProbeConfig)

register_step("probe", ProbeJob)

def run(cfg):
    with Job(cfg) as job:
        job.run_map(lambda recs: ({**r, "tag": cfg.probe.tag} for r in recs))
        return job.finish()
