
app_name = "agentpay"
urlpatterns: list = []
