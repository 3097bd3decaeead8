from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("sagas", "0010_settled_idx"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="hubpayment",
            index=models.Index(fields=["memo"], name="saga_hub_payments_memo_idx"),
        ),
    ]
