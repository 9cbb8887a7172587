"""Keras (tf_keras) integration: callbacks for model.fit under ParameterServerStrategy."""
