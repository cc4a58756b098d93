"""A verifiers taskset whose reward calls a judge that times out on long replies: a model that
pads its reply leaves the rollout without a verdict (the timeout is no fault of the code)."""

import verifiers.v1 as vf

__all__ = ["LongReplyTaskset"]


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData, vf.State]):
    @vf.reward
    async def judged(self, task: SumData, trace: vf.Trace) -> float:
        if len(trace.last_reply) > 2000:
            raise TimeoutError("the judge did not answer within 30s")
        return float(trace.last_reply.strip() == task.answer)


class LongReplyTaskset(vf.Taskset[SumTask]):
    def load(self):
        yield SumTask(SumData(prompt="What is 2+2?", answer="4", id="s4"), self.config.task)
