"""What the API's views of jobs and of each feature share, below them all:
a job-scoped view (base.py) and file downloads (downloads.py). The
features' views (metrics, goodput, evals, profiling) and jobs/views/ build
on these; nothing here imports a feature's views."""
