from django.db import migrations, models


class Migration(migrations.Migration):
    """RazorpayX's fees and tax of a processed payout (the books' expense lines)."""

    dependencies = [("payouts", "0009_request_expired")]

    operations = [
        migrations.AddField(model_name="withdrawalpayout", name="fees_paise",
                            field=models.BigIntegerField(blank=True, null=True)),
        migrations.AddField(model_name="withdrawalpayout", name="tax_paise",
                            field=models.BigIntegerField(blank=True, null=True)),
    ]
