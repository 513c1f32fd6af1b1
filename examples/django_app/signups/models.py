from django.db import models


class Signup(models.Model):
    email = models.EmailField(unique=True)
    referrals = models.IntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    welcomed_at = models.DateTimeField(null=True)  # set by the send_welcome job
