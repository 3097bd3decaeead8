from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('anchor', '0014_deposit_refunds'),
    ]

    operations = [
        migrations.AddField(
            model_name='inboundevent',
            name='body',
            field=models.TextField(blank=True, null=True),
        ),
    ]
